"""The torch.compile backend "dnnc": `torch.compile(model, backend="dnnc", options={...})`,
registered through the `torch_dynamo_backends` entry point in pyproject.toml, so no import of
dnnc is needed first.

Dynamo hands `dnnc_backend` an FX graph of torch calls; aot_autograd (in inference mode:
outputs carry no autograd history) functionalises it and decomposes it to core ATen
(`torch_fx.DECOMPOSITIONS`); `compile_aten` then freezes the module's parameters and buffers into
constants (read once, at compile time, as torch's own freezing does: weights fold and pack at
compile time; a parameter changed after the compile is not seen), splits the graph with
torch's CapabilityBasedPartitioner into the largest subgraphs `frontend/torch_fx.py` imports
(no cycles), compiles each with `dnnc.compile`, and leaves the rest to torch: the result is
one FX GraphModule that calls dnnc's partitions and torch's ops in turn. An input the graph
writes (a KV cache: aot_autograd's `copy_(cache, index_put(cache, pos, v))`) is written by the
dnnc partition that computes its new value, into the caller's tensor (`Graph.aliases`, in
place where only the write reads the old value: `_input_writes`); one whose write stays in
torch is written there, in place where nothing later reads its old value
(`_write_in_place`). CPU tensors pass in
and out without copies (NumPy views of the tensors; `torch.from_numpy` of the outputs); CUDA
tensors go to a target that takes device arrays (its registry entry's `from_dlpack`), read in
place, on torch's current CUDA stream (the target's runtime reads it off a torch tensor
argument), and its device outputs come back as tensors the runtime fills (cuda's `to="torch"`;
else `torch.from_dlpack` of its arrays). A dim
dynamo made symbolic is a dnnc symbolic dim: a new batch size runs on the same compile (per
dnnc's own rules for new sizes). What stayed in torch is counted in `stats()` and named in
the log with `options={"verbose": True}`. This module imports torch; `import dnnc` never
imports it.
"""

from __future__ import annotations

import collections
import functools
import logging
import operator
import sys
import warnings
import weakref
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.fx as fx
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.guards import GuardBuilder, install_guard
from torch._functorch._aot_autograd.schemas import MutationType, OutputType
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from ..backends.registry import REGISTRY
from ..errors import ArgumentError, DNNCError
from ..frontend.torch_aten import np_dtype
from ..frontend.torch_fx import DECOMPOSITIONS, import_fx, op_name, supported, tensor_array
from .driver import compile as dnnc_compile
from .module import DeviceArray

__all__ = ["dnnc_backend", "compile_aten", "stats", "reports", "GraphReport", "OPTIONS",
           "Placement", "placement", "HOST", "tensor_device"]

LOG = logging.getLogger(__name__)

OPTIONS = {"target": None, "precision": None, "tuning_log": None, "opt_level": None,
           "cache": True, "verbose": False, "tag_guards": True}
"""The backend's options and their defaults: `target`, `precision`, `tuning_log`, `opt_level`
and `cache` are `dnnc.compile`'s (`target` None: the fastest target taking the example
inputs where they are: host arrays for CPU tensors, device arrays for CUDA ones); `verbose`
logs the ops left in torch by name; `tag_guards` has dynamo guard the modules by their
dicts' tags (`_guard_tags`, where `GUARD_TAGS_SAFE`), False (and where they are not safe) its
guard on every attribute and parameter each call."""

VIEW_OPS = {"aten.view.default", "aten._unsafe_view.default", "aten.permute.default",
            "aten.expand.default", "aten.unsqueeze.default", "aten.squeeze.dim",
            "aten.squeeze.dims", "aten.slice.Tensor", "aten.select.int", "aten.clone.default",
            "aten.alias.default", "aten.detach.default", "getitem"}
"""Ops that move no arithmetic: a partition of only these is left to torch (a dnnc call
would copy what torch views for free)."""


@dataclass
class GraphReport:
    """One graph the backend compiled: its ATen ops, how many dnnc compiled in how many
    partitions, and the ops left to torch (op name -> count)."""

    ops: int = 0
    dnnc_ops: int = 0
    partitions: int = 0
    torch_ops: collections.Counter = field(default_factory=collections.Counter)
    failed: list[str] = field(default_factory=list)   # partitions dnnc refused, and why
    direct_call: bool = False   # dynamo calls it without aot_autograd's wrapper (`_plain`)
    # each partition's CompiledModel, weakly: a report never keeps a dropped compile alive
    _models: list[weakref.ref] = field(default_factory=list)

    @property
    def models(self) -> list:
        """The CompiledModel of each partition still in use (torch.compile holds them)."""
        return [m for m in (ref() for ref in self._models) if m is not None]


_REPORTS: list[GraphReport] = []


def reports() -> list[GraphReport]:
    """Every graph compiled by the backend in this process, oldest first."""
    return list(_REPORTS)


def stats() -> dict:
    """Totals over `reports()`: graphs, ATen ops, those dnnc compiled, partitions, and
    `torch_ops` (how many stayed in torch) with `torch_op_names` (name -> count)."""
    names: collections.Counter = collections.Counter()
    for r in _REPORTS:
        names.update(r.torch_ops)
    return {"graphs": len(_REPORTS), "ops": sum(r.ops for r in _REPORTS),
            "dnnc_ops": sum(r.dnnc_ops for r in _REPORTS),
            "partitions": sum(r.partitions for r in _REPORTS),
            "torch_ops": sum(names.values()), "torch_op_names": dict(names),
            "failed_partitions": sum(len(r.failed) for r in _REPORTS)}


def check_backend_options(options, device: str = "cpu") -> dict:
    """`options` over `OPTIONS`' defaults; `ArgumentError` for a key the backend does not
    take (the compile options themselves are checked by `dnnc.compile`). The default target
    is the fastest that takes tensors on torch device type `device` in place (CPU: host
    arrays; a GPU: device arrays, else the host's: the ops then stay in torch)."""
    options = dict(options or {})
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ArgumentError(f"torch.compile(backend='dnnc') options: unknown {', '.join(unknown)}"
                            f"; it takes {', '.join(OPTIONS)}")
    options = {**OPTIONS, **options}
    if options["target"] is None:
        host = [s for s in REGISTRY.values() if s.available() and s.from_dlpack is None]
        gpu = [s for s in REGISTRY.values() if s.available() and s.from_dlpack is not None]
        options["target"] = max(gpu if device != "cpu" and gpu else host,
                                key=lambda s: s.speed).name
    return options


def tensor_device(example_inputs) -> str:
    """The torch device type of the example inputs' CUDA tensors, else "cpu"."""
    return next((t.device.type for t in example_inputs
                 if isinstance(t, torch.Tensor) and t.is_cuda), "cpu")


@dataclass(frozen=True)
class Placement:
    """Where a compile's partitions run: `device`, the torch device type whose tensors its
    target takes in place ("cpu" for a target of host arrays), and `outputs`, the kind of
    array its calls return (NumPy for CPU tensors, the target's device arrays for others)."""

    device: str
    outputs: str

    @property
    def on_device(self) -> bool:
        return self.device != "cpu"


HOST = Placement("cpu", outputs="numpy")
"""Partitions of CPU tensors: NumPy arrays in and out."""


def placement(target: str, device: str) -> Placement:
    """The placement of `target`'s partitions for example tensors on `device`: on that
    device where the target takes device arrays, else on the host (tensors on another
    device then stay in torch: `torch_fx.supported` refuses them)."""
    spec = REGISTRY[target]
    if device != "cpu" and spec.from_dlpack is not None:
        return Placement(device, spec.returns[0])
    return HOST


def dnnc_backend(gm: fx.GraphModule, example_inputs, options: dict | None = None):
    """The dynamo backend: the callable that runs `gm` through dnnc (and torch, for what dnnc
    does not compile). Runs inference only: under `torch.no_grad()` whatever the caller's
    grad mode, so its outputs carry no autograd history."""
    device = tensor_device(example_inputs)
    options = check_backend_options(options, device)
    _guard_tags(options["tag_guards"] and GUARD_TAGS_SAFE)
    # what aot_autograd lifts to the front of its graph's inputs: the graph module's own
    # parameters and buffers, where dynamo left them attributes (`prepare_freezing`, or
    # `inline_inbuilt_nn_modules` off), the module's weights frozen as dynamo's inputs are
    # where it passes them
    lifted = {**dict(gm.named_parameters(remove_duplicate=False)),
              **dict(gm.named_buffers(remove_duplicate=False))}
    weights = {**frozen_attributes(gm, lifted),
               **{len(lifted) + i: source for i, source in
                  frozen_inputs(gm, example_inputs).items()}}
    _guard_identity(weights.values())
    frozen, lifted = set(weights), list(lifted.values())
    state: dict = {}
    fw = functools.partial(compile_aten, real_inputs=[*lifted, *example_inputs],
                           frozen=frozen, options=options, state=state,
                           place=placement(options["target"], device), lifted=len(lifted))
    with torch.no_grad():
        # the writes of inputs stay in the graph (`copy_` of the new value, which aot's
        # metadata marks MUTATED_IN_GRAPH), where dnnc's partition writes the cache itself
        # (`_input_writes`) or, left in torch, `_write_in_place` makes index_put do so
        compiled = aot_autograd(fw_compiler=fw, decompositions=DECOMPOSITIONS,
                                keep_inference_input_mutations=True)(gm, example_inputs)
    # a graph that writes no input and returns no view of one needs none of aot_autograd's
    # bookkeeping around its calls (`_plain`): dynamo's arguments go straight to it
    call = state.get("direct") or compiled

    def run(*args):
        if not torch.is_grad_enabled():
            return call(*args)
        with torch.no_grad():
            return call(*args)
    return run


_GUARD_CONFIG = "use_recursive_dict_tags_for_guards"
_guard_config_before: list[bool] = []   # the config's value before `_guard_tags` set it

GUARD_TAGS_SAFE = sys.version_info < (3, 12) or \
    torch.torch_version.TorchVersion(torch.__version__) >= "2.13"
"""Whether this torch's recursive dict tags are safe to guard by. Before torch 2.13 on
Python 3.12 and later (where they use CPython's dict watchers), a watched dict freed or
changed while two guard managers recorded it is undefined behaviour: the watcher callback
walks the dict's list of managers while each one it disables erases itself from that list
(pytorch/pytorch#178703). A module checked against another module's compile records its
dicts in that compile's manager too, and the identity guards (`_guard_identity`) make one
compile per module: torch 2.11 with Python 3.12 segfaulted in
`GuardManager::unwatch_all_saved_dict_pointers` compiling two modules of one class in
turn, in the first round or within 25 (torch 2.11 turns the tags on by default; main's
backend, without the identity guards, crashed once in 10 rounds and ran 25 clean twice).
With the tags off no round crashed; torch 2.13 with Python 3.12 ran 25 rounds clean with
them on, as does any torch on Python 3.11, which reads the tags without watchers."""


def _guard_tags(on: bool) -> None:
    """Have dynamo build the guards of the frame it is compiling with torch's recursive dict
    tags (`on`) or without them. With them a call checks each module's `__dict__` tag, and
    walks a module's attributes, hooks and parameters (mobilenet_v3_small: 3189 guards, 215
    of them on tensors) only where an attribute was set since. The full walk cost a call
    ~300 us of CPU time there (cold caches after dnnc's kernels), more than the rest of the
    backend's call. What the tags do not see, a tensor in a module changed in place
    (`.data =`, `resize_`), dnnc does not read anyway: it froze the parameters and buffers at
    the compile. Set for the frame's guard build only (dynamo builds its guards after the
    backend returns, then runs its compile-end callbacks: `_restore_guard_tags` puts back
    the user's setting). Nothing where this torch has no such guards, where the config
    already says `on`, or outside a dynamo compile (a backend called by hand)."""
    config, handler = torch._dynamo.config, getattr(torch._dynamo, "callback_handler", None)
    if not hasattr(handler, "end_callbacks") or not hasattr(config, _GUARD_CONFIG) or \
            torch._guards.TracingContext.try_get() is None or \
            getattr(config, _GUARD_CONFIG) == on:
        return
    if _restore_guard_tags not in handler.end_callbacks:   # (torch._dynamo.reset() clears them)
        handler.register_end_callback(_restore_guard_tags)
    if not _guard_config_before:
        _guard_config_before.append(getattr(config, _GUARD_CONFIG))
    setattr(config, _GUARD_CONFIG, on)


def _restore_guard_tags(_args=None) -> None:
    """dynamo's compile-end callback: the guard config as it was before `_guard_tags`."""
    if _guard_config_before:
        setattr(torch._dynamo.config, _GUARD_CONFIG, _guard_config_before.pop())


def frozen_inputs(gm: fx.GraphModule, example_inputs) -> dict:
    """Positions of dynamo's graph inputs that are a module's parameters or buffers (read
    from their sources, `L['self']._modules['fc']._parameters['weight']`), the constants
    `compile_aten` freezes, each with its source."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    sources = [getattr(n.meta.get("grapharg"), "source", None) for n in placeholders]
    return {i: source for i, (source, example) in enumerate(zip(sources, example_inputs))
            if isinstance(example, torch.Tensor) and _weight(example, source)}


def frozen_attributes(gm: fx.GraphModule, lifted: dict) -> dict:
    """Positions in `lifted` (the graph module's parameters and buffers, by name, in the
    order aot_autograd lifts them) of a module's parameters and buffers, each with its
    source where dynamo records one: each tensor of a torch.nn module dynamo kept whole
    (`inline_inbuilt_nn_modules` off: a dotted name, `L__self___fc.weight`; dynamo guards
    the module itself), and each tensor dynamo made an attribute itself
    (`prepare_freezing`) whose source says so; not a module's other tensor attributes, nor a
    global tensor (`install_free_tensors`), which stay arguments read at every call, as they
    are where dynamo passes them."""
    sources = getattr(gm, "_param_name_to_source", None) or {}
    return {i: sources.get(name) for i, (name, tensor) in enumerate(lifted.items())
            if "." in name or _weight(tensor, sources.get(name))}


def _guard_identity(sources) -> None:
    """Guard each frozen weight's identity (dynamo's ID_MATCH on its source), as dynamo
    guards the parameters for torch's own freezing (`mark_static_input(guard=True)` under
    `torch._inductor.config.freezing`). Without it a compile served every module of the
    class: dynamo keeps its compiles per code object, and its guards check a weight's
    shape and dtype, not which tensor it is, so `torch.compile(b)` after
    `torch.compile(a)` ran a's frozen weights on b's calls; a parameter replaced
    (`fc.weight = nn.Parameter(w)`) now compiles again too (one changed in place is still
    not seen). Added while dynamo compiles the frame (it builds the frame's guards after the
    backend returns); nothing for a backend called by hand, nor for a weight of a module
    dynamo kept whole (`inline_inbuilt_nn_modules` off, torch 2.11: a source under the
    module's, `L['self'].fc.bias`), where dynamo guards the module's identity itself and
    refuses a guard on its tensors."""
    if torch._guards.TracingContext.try_get() is None:
        return
    for source in sources:
        if source is not None and not source.is_specialized_nn_module():
            install_guard(source.make_guard(GuardBuilder.ID_MATCH))


def _weight(tensor: torch.Tensor, source) -> bool:
    """Whether `tensor`, reached through dynamo's `source`, is a parameter or a buffer of a
    module."""
    name = getattr(source, "name", "") if source is not None else ""
    name = name() if callable(name) else name
    return isinstance(tensor, torch.nn.Parameter) or "._parameters[" in name or \
        "._buffers[" in name


def _fw_metadata():
    """aot_autograd's analysis of the graph it is compiling (which inputs it writes, which
    outputs alias what), or None where this torch does not say."""
    return getattr(torch._guards.TracingContext.try_get(), "fw_metadata", None)


def _mutated(count: int) -> set[int]:
    """The inputs of the graph aot_autograd is compiling that it writes (a BatchNorm's running
    statistics in training, a KV cache): never frozen."""
    info = getattr(_fw_metadata(), "input_info", None)
    if info is None or len(info) != count:
        return set(range(count))   # unknown: freeze nothing
    return {i for i, inp in enumerate(info) if inp.mutates_data or inp.mutates_metadata}


def _plain(count: int) -> bool:
    """Whether the graph aot_autograd is compiling takes dynamo's `count` inputs as they are,
    writes none but in the graph itself (a `copy_` into the input), returns no view of an
    input or of another output and threads no effect tokens: then calling it is all
    aot_autograd's runtime wrapper would do."""
    meta = _fw_metadata()
    try:
        return (len(meta.input_info) == count and not meta.tokens and
                meta.num_intermediate_bases == 0 and
                all(type(m).__name__ in ("int", "PlainTensorMeta")   # no tensor subclass
                    for m in meta.subclass_inp_meta) and
                all(i.mutation_type in (MutationType.NOT_MUTATED,
                                        MutationType.MUTATED_IN_GRAPH)
                    for i in meta.input_info) and
                all(o.output_type == OutputType.non_alias for o in meta.output_info))
    except AttributeError:   # another torch's metadata: keep the wrapper
        return False


class _Support(OperatorSupportBase):
    def __init__(self, device: str):
        super().__init__()
        self.device = device

    def is_node_supported(self, submodules, node: fx.Node) -> bool:
        if op_name(node) == "getitem":   # of a tuple from a node dnnc imports
            return supported(node.args[0], self.device)
        return supported(node, self.device)


def compile_aten(gm: fx.GraphModule, fake_inputs, *, real_inputs, frozen: set[int],
                 options: dict, state: dict | None = None,
                 place: Placement | None = None, lifted: int = 0) -> "LiveArguments":
    """aot_autograd's fw_compiler: `gm` (core ATen, placeholders in the order of
    `real_inputs`: the `lifted` weights, then dynamo's inputs) with its supported partitions
    (tensors on `place.device`) compiled by dnnc (default: `HOST`), the rest in torch.
    `state["direct"]` is set to the result when dynamo may call it directly (`_plain`, and
    none of the inputs is one of the `lifted` weights aot_autograd adds to dynamo's)."""
    place = place or HOST
    report = GraphReport()
    _REPORTS.append(report)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(real_inputs):   # aot added or merged inputs: none frozen
        frozen = set()
    frozen = frozen - _mutated(len(placeholders))
    with unset_fake_temporarily():   # aot_autograd compiles in fake mode; weights are real
        # by name: fusing partitions sorts the graph into new nodes
        # copies: a weight changed in place later must not change half of the compile
        constants = {placeholders[i].name: tensor_array(real_inputs[i]).copy() for i in frozen}
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    report.ops = len(calls)
    partitioner = CapabilityBasedPartitioner(gm, _Support(place.device),
                                             allows_single_node_partition=True)
    partitions = [p for p in partitioner.propose_partitions()
                  if any(op_name(n) not in VIEW_OPS for n in p.nodes)]
    fused = partitioner.fuse_partitions(partitions, prefix="dnnc_partition_")
    for node in list(fused.graph.nodes):
        if node.op == "call_module" and node.target.startswith("dnnc_partition_"):
            _compile_partition(fused, node, constants, options, report, place)
    _write_in_place(fused)
    fused.graph.lint()
    fused.recompile()
    for node in fused.graph.nodes:
        if node.op == "call_function" and _tensor_op(node):
            report.torch_ops[op_name(node)] += 1
        elif node.op == "call_module" and isinstance(getattr(fused, node.target),
                                                     fx.GraphModule):   # dnnc refused it
            for inner in getattr(fused, node.target).graph.nodes:
                if inner.op == "call_function" and _tensor_op(inner):
                    report.torch_ops[op_name(inner)] += 1
    _log(report, options)
    runner = LiveArguments(fused)
    report.direct_call = not lifted and _plain(len(real_inputs))
    if state is not None and report.direct_call:
        state["direct"] = runner
    return runner


def _write_in_place(fused: fx.GraphModule) -> None:
    """`copy_(cache, index_put(cache, idx, v))`, the functional write of an input the graph
    ends with (a static KV cache's update at `cache_position`), as `index_put_(cache, idx, v)`:
    the cache written where it is, not copied whole twice a call (the new tensor, then back
    into the input). Taken where every other reader of `cache` runs before the write (it
    reads the old value) and the write is the input's only one."""
    order = {node: i for i, node in enumerate(fused.graph.nodes)}
    for copy in [n for n in fused.graph.nodes if n.op == "call_function" and
                 n.target is torch.ops.aten.copy_.default]:
        target, new = copy.args[:2]
        if not (target.op == "placeholder" and isinstance(new, fx.Node) and
                new.op == "call_function" and new.target is torch.ops.aten.index_put.default
                and new.args[0] is target and not copy.users):
            continue
        if any(order[user] > order[new] for user in target.users if user not in (new, copy)):
            continue
        new.target = torch.ops.aten.index_put_.default
        fused.graph.erase_node(copy)


class LiveArguments:
    """The fused graph called with the arguments it still reads: dynamo passes every
    parameter of the module at every call, and the frozen ones now live in dnnc's partitions
    (efficientnet_b0: 312 arguments, 311 of them weights)."""

    def __init__(self, fused: fx.GraphModule):
        placeholders = [n for n in fused.graph.nodes if n.op == "placeholder"]
        self.live = [i for i, n in enumerate(placeholders) if n.users]
        for node in placeholders:
            if not node.users:
                fused.graph.erase_node(node)
        fused.recompile()
        if hasattr(fused, "real_recompile"):   # a lazy GraphModule: its code now, not later
            fused.real_recompile()
        self.fused = fused
        self._forward = fused.forward   # the generated code, without Module.__call__

    def __call__(self, *args):
        return self._forward(*[args[i] for i in self.live])


def _tensor_op(node: fx.Node) -> bool:
    """An op on tensors, not the unpacking of a tuple or arithmetic on sizes (`s77 * 4`)."""
    return op_name(node) != "getitem" and \
        not isinstance(node.meta.get("val"), (torch.SymInt, int))


def _compile_partition(fused: fx.GraphModule, node: fx.Node, constants: dict,
                       options: dict, report: GraphReport, place: Placement) -> None:
    """Replace partition `node` (a call_module of an FX submodule) by a `DnncPartition` that
    runs its dnnc compile; frozen arguments become the compile's constants. A partition dnnc
    refuses (an op's operands it cannot take) stays in torch, said in `report.failed`."""
    sub = getattr(fused, node.target)
    frozen = {i: constants[a.name] for i, a in enumerate(node.args) if _frozen(a, constants)}
    writes = _input_writes(fused, node)
    try:
        graph = import_fx(sub, frozen, name=node.target)
        names = [v.name for v in graph.inputs]
        placeholders = [n.name for n in sub.graph.nodes if n.op == "placeholder"]
        graph.aliases = {k: names.index(placeholders[a]) for k, (a, _) in writes.items()}
        model = dnnc_compile(graph, options["target"], opt_level=options["opt_level"],
                             tuning_log=options["tuning_log"], precision=options["precision"],
                             cache=options["cache"], outputs=place.outputs)
    except DNNCError as exc:
        report.failed.append(f"{node.target}: {exc}")
        LOG.debug("%s stays in torch: %s", node.target, exc)
        return
    except Exception as exc:   # a dnnc bug: say so, run the partition in torch
        report.failed.append(f"{node.target}: {type(exc).__name__}: {exc}")
        warnings.warn(f"dnnc could not compile {node.target} ({type(exc).__name__}: {exc}); "
                      f"it runs in torch")
        return
    keep = [i for i, a in enumerate(node.args) if not _frozen(a, constants)]
    tensors = [k for k, i in enumerate(keep)
               if isinstance(node.args[i], fx.Node) and
               isinstance(node.args[i].meta.get("val"), torch.Tensor)]
    single = isinstance(next(n for n in sub.graph.nodes if n.op == "output").args[0], fx.Node)
    setattr(fused, node.target, DnncPartition(model, tensors, single, place.on_device,
                                              written={keep.index(a) for a, _ in
                                                       writes.values()},
                                              unused=set(writes)))
    for k, (a, copy) in writes.items():   # the partition writes the input: no copy_ after it
        new = copy.args[1]
        # read after the partition (copy_ returns the input): the input holds the new value
        copy.replace_all_uses_with(node.args[a])
        fused.graph.erase_node(copy)
        new.replace_all_uses_with(node.args[a])
        if new is not node:
            fused.graph.erase_node(new)
    node.args = tuple(node.args[i] for i in keep)
    report.partitions += 1
    report._models.append(weakref.ref(model))
    report.dnnc_ops += sum(1 for n in sub.graph.nodes if n.op == "call_function")


def _input_writes(fused: fx.GraphModule, node: fx.Node) -> dict[int, tuple[int, fx.Node]]:
    """The outputs of partition `node` that the graph copies into an input the partition
    reads (`copy_(cache, out)`, aot_autograd's write of a mutated input kept in the graph:
    a static KV cache's new value): output position -> (argument position, the copy_), where
    that copy_ is the input's only write and nothing reads the input after the partition
    but the copy_ (whose result, the input itself, may be read: a graph output).
    dnnc then writes the output into the input's tensor itself (`Graph.aliases`)."""
    order = {n: i for i, n in enumerate(fused.graph.nodes)}
    outputs = {node: 0} if not any(u.target is operator.getitem for u in node.users) else \
        {u: u.args[1] for u in node.users if u.target is operator.getitem}
    found = {}
    for value, k in outputs.items():
        for copy in value.users:
            target = copy.args[0] if copy.target is torch.ops.aten.copy_.default else None
            if target is None or copy.args[1] is not value or \
                    target.op != "placeholder" or target not in node.args or \
                    any(u is not node and u is not copy and order[u] > order[node]
                        for u in target.users) or \
                    sum(1 for u in target.users if op_name(u).endswith("_.default")) != 1:
                continue
            found[k] = (node.args.index(target), copy)
    return found


def _frozen(arg, constants: dict) -> bool:
    return isinstance(arg, fx.Node) and arg.op == "placeholder" and arg.name in constants


class DnncPartition(torch.nn.Module):
    """A partition compiled by dnnc, called as the FX submodule it replaces: its tensor
    arguments (at `tensors`; SymInt arguments are read from their shapes by dnnc) become
    NumPy views, its outputs torch tensors over dnnc's arrays, neither copied (an argument
    that is not contiguous is copied once, as dnnc reads dense arrays).
    `on_device`: the arguments are GPU tensors, given to the model as they are (its target
    reads them in place, on torch's current stream: `CompiledModel` sees their
    `__cuda_array_interface__` and the runtime the tensor behind it), and its outputs come
    back as tensors the runtime fills (`to="torch"`: one device copy each, as a CuPy output
    is; a CuPy copy wrapped by `torch.from_dlpack` cost ~50 us an output under cProfile).

    `written`: the arguments the model writes (`Graph.aliases`: a KV cache updated in
    place; one that is not contiguous is passed as its strided view, which dnnc writes back)
    and `unused`, the outputs that are those writes: not wrapped (None; the graph reads the
    argument itself).

    A call costs what dnnc's own does plus the conversions: `__call__` skips
    `nn.Module.__call__`'s hook dispatch (a partition has no hooks), the conversion of
    each output is chosen once, here, and a partition of static shapes whose tensors are
    plain (C-order, no bfloat16) takes the model's `bound_call` after its first call: its
    arguments' shapes, dtypes and strides are fixed by dynamo's guards on the graph's
    inputs, so nothing is checked again per call."""

    def __init__(self, model, tensors: list[int], single: bool, on_device: bool = False,
                 written: set[int] = frozenset(), unused: set[int] = frozenset()):
        super().__init__()
        self.model = model
        self.tensors = tensors
        self.single = single
        self.on_device = on_device
        self.written = written
        if on_device:
            self._call = self._device_call
            # tensors filled by the runtime where its target returns them, else DLPack
            self._kind = "torch" if "torch" in REGISTRY[model.target].returns else None
        else:
            self._call = self._host_call
            halves = [t.dtype.np.name == "bfloat16" for t in model.output_types]
            self._wraps = [_unused if k in unused else _bfloat16_tensor if h else
                           torch.from_numpy for k, h in enumerate(halves)]
            self._plain = not any(halves) and not unused
        # the model's `bound_call`, taken after the first call; device: interfaces' fixed parts
        self._first, self._bound, self._faces = True, None, []

    def __call__(self, *args):
        return self._call(args)

    forward = __call__

    def _host_call(self, args):
        if self._bound is not None:
            outs = self._bound([args[i].numpy() for i in self.tensors])
            if self._plain:
                return torch.from_numpy(outs[0]) if self.single else \
                    tuple(map(torch.from_numpy, outs))
            return self._wraps[0](outs[0]) if self.single else \
                tuple(w(o) for w, o in zip(self._wraps, outs))
        arrays, plain = [], True
        for i in self.tensors:
            t = args[i]
            if not t.is_contiguous():
                plain = False
                if i not in self.written:
                    t = t.contiguous()
            try:   # (bfloat16, a tensor with grad: tensor_array)
                arrays.append(t.numpy())
            except (RuntimeError, TypeError):
                arrays.append(tensor_array(t))
                plain = False
        outs = self.model.run(*arrays)
        if self._first:   # (once: None where the model has no such path)
            self._bound = self.model.bound_call(*arrays) if plain else None
            self._first = False
        if self.single:
            return self._wraps[0](outs[0])
        if self._plain:
            return tuple(map(torch.from_numpy, outs))
        return tuple(w(o) for w, o in zip(self._wraps, outs))

    def _device_call(self, args):
        if self._bound is not None:   # each tensor's interface made from its address alone
            outs = self._bound([DeviceArray(args[i], face={**face, "data": (args[i].data_ptr(),
                                                                             False)})
                                for i, face in zip(self.tensors, self._faces)])
        else:   # (detached: torch refuses the interface of a grad tensor)
            given = [args[i].detach() for i in self.tensors]
            outs = self.model.run(*given, to=self._kind)
            if self._first:
                self._bound = self._bind_device(given)
                self._first = False
        if self._kind != "torch":
            outs = [torch.from_dlpack(o) for o in outs]
        return outs[0] if self.single else tuple(outs)


    def _bind_device(self, tensors: list):
        """The model's `bound_call` for these tensors where each is C-order and of a NumPy
        dtype (its `__cuda_array_interface__` then depends on its address alone: torch
        builds the interface in Python, ~7 us a tensor under cProfile on the device), with
        the interfaces' fixed parts (`_faces`); else None."""
        faces = []
        for t in tensors:
            dtype = np_dtype(t.dtype)
            if dtype is None or dtype.name == "bfloat16" or not t.is_contiguous():
                return None
            faces.append({"shape": tuple(t.shape), "typestr": dtype.str, "strides": None,
                          "version": 3})
        self._faces = faces
        return self.model.bound_call(*tensors, to=self._kind)


def _unused(array) -> None:
    return None


def _bfloat16_tensor(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)


def _log(report: GraphReport, options: dict) -> None:
    level = logging.INFO if options["verbose"] else logging.DEBUG
    left = sum(report.torch_ops.values())
    LOG.log(level, "graph of %d ATen ops: %d in %d dnnc partition(s), %d left to torch%s",
            report.ops, report.dnnc_ops, report.partitions, left,
            (": " + ", ".join(f"{n} x{c}" for n, c in report.torch_ops.most_common()))
            if left else "")
    for failure in report.failed:
        LOG.log(level, "left to torch: %s", failure)
