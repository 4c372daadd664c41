"""Magnitude pruning of a model's constant weights (issue 34, item 5), so anyone can see the
speed and accuracy of a pruned model before training one: `prune` (or `prune_model`) zeroes
the smallest weights of every Conv, Gemm and MatMul layer of an `onnx.ModelProto`, per layer,
and `output_error` measures what that costs on seeded random inputs. `dnnc sparsify` is this
module from the command line (`cli/sparsify.py`, docs/cli.md).

A layer is a node whose weight is a constant: Conv's W, Gemm's B, MatMul's B (or A, when A is
the constant one), held in an initializer or a Constant node, directly or behind a
DequantizeLinear (an int8 weight: ranked by its dequantized magnitude, pruned to its zero
point, per tensor or per axis) or a Cast (a float16 weight: pruned in its own type). Depthwise
convolutions are left dense unless asked (too few weights per output to gain from sparsity;
mobilenet_v2 keeps them dense in issue 34's bar), and so is every layer named in `keep`.

Each weight is seen as a matrix of rows (outputs) by columns (the reduction): Conv's columns
are (kh, kw, C/group) with input channels fastest, as NVIDIA's ASP and NHWC implicit GEMMs
order them, so an N:M group lies along input channels; MatMul's B (K, N) is its transpose.
Patterns (`Pattern`): `unstructured`, the round(sparsity x size) smallest |w| of the tensor;
`N:M` (2:4), the N largest of every M consecutive columns of a row kept (sparsity 1 - N/M);
`RxC` blocks (4x1: four outputs by one column; 1x4), whole blocks ranked by their L2 norm.

This module never changes a graph's structure, a bias or an operand that is not constant, and
never prunes a model in place (it works on a copy). It needs no onnxruntime unless
`output_error` is asked to run on it.
"""

from __future__ import annotations

import logging
import re
import sys
from dataclasses import dataclass, field
from numbers import Real

import numpy as np
import onnx
from onnx import numpy_helper

from ..backends.registry import REGISTRY
from ..errors import ArgumentError
from ..progress import Progress
from .arguments import check_choice, check_int, check_optional_bool

log = logging.getLogger(__name__)

PATTERN_FORMS = "unstructured, N:M (e.g. 2:4) or RxC blocks (e.g. 4x1, 1x4)"
REFERENCES = (next(iter(REGISTRY)), "onnxruntime")
"""What `output_error` runs both models on: dnnc's reference target (the registry's first),
or onnxruntime."""


# ---------------------------------------------------------------------------------------------
# Patterns

@dataclass(frozen=True)
class Pattern:
    """Which weights may be zeroed together: `unstructured` (any), `n_m` (keep `keep` of every
    `group` consecutive columns of a row) or `block` (`rows` x `cols` blocks)."""

    text: str
    kind: str                # "unstructured", "n_m" or "block"
    keep: int = 0
    group: int = 0
    rows: int = 1
    cols: int = 1

    @property
    def fixed_sparsity(self) -> float | None:
        """The sparsity an N:M pattern implies (None: the caller's)."""
        return 1 - self.keep / self.group if self.kind == "n_m" else None

    def divides(self, rows: int, cols: int) -> bool:
        if self.kind == "n_m":
            return cols % self.group == 0
        return rows % self.rows == 0 and cols % self.cols == 0

    def needs(self) -> str:
        """What the pattern needs of a layer's axes, in words."""
        if self.kind == "n_m":
            return f"a reduction axis that is a multiple of {self.group}"
        return f"outputs a multiple of {self.rows} and a reduction axis a multiple of " \
               f"{self.cols}"


def parse_pattern(text) -> Pattern:
    """`unstructured`, `N:M` with 0 < N < M, or `RxC` with R, C >= 1."""
    if not isinstance(text, str):
        raise ArgumentError(f"pattern must be {PATTERN_FORMS}, not {type(text).__name__}")
    spec = text.strip().lower()
    if spec == "unstructured":
        return Pattern("unstructured", "unstructured")
    if m := re.fullmatch(r"(\d+):(\d+)", spec):
        keep, group = int(m[1]), int(m[2])
        if not 0 < keep < group:
            raise ArgumentError(f"pattern {text!r}: N:M keeps N of every M weights, with "
                                f"0 < N < M")
        return Pattern(spec, "n_m", keep=keep, group=group)
    if m := re.fullmatch(r"(\d+)x(\d+)", spec):
        rows, cols = int(m[1]), int(m[2])
        if rows < 1 or cols < 1:
            raise ArgumentError(f"pattern {text!r}: a block is at least 1x1")
        return Pattern(spec, "block", rows=rows, cols=cols)
    raise ArgumentError(f"pattern must be {PATTERN_FORMS}, not {text!r}")


def keep_mask(scores: np.ndarray, pattern: Pattern, sparsity: float) -> np.ndarray:
    """Which entries of a (rows, columns) matrix of magnitudes stay: the pattern's largest.
    Ties go to the earlier entry (a stable sort), so the result is a function of the input."""
    rows, cols = scores.shape
    if pattern.kind == "n_m":
        groups = scores.reshape(rows, cols // pattern.group, pattern.group)
        order = np.argsort(-groups, axis=-1, kind="stable")[..., :pattern.keep]
        mask = np.zeros(groups.shape, bool)
        np.put_along_axis(mask, order, True, axis=-1)
        return mask.reshape(rows, cols)
    if pattern.kind == "block":
        blocks = scores.reshape(rows // pattern.rows, pattern.rows, cols // pattern.cols,
                                pattern.cols)
        norms = np.sqrt(np.sum(np.square(blocks), axis=(1, 3)))
        kept = keep_mask(norms, Pattern("unstructured", "unstructured"), sparsity)
        return np.repeat(np.repeat(kept, pattern.rows, axis=0), pattern.cols, axis=1)
    mask = np.ones(scores.size, bool)
    mask[np.argsort(scores, axis=None, kind="stable")[:round(sparsity * scores.size)]] = False
    return mask.reshape(rows, cols)


# ---------------------------------------------------------------------------------------------
# Layers

@dataclass
class Layer:
    """A node with a constant weight: where the weight is and how it reads as a matrix."""

    node: str                # the node's name ("Conv_3" when the model leaves it unnamed)
    op: str
    weight: str              # the constant tensor's name (an initializer or a Constant's output)
    via: str                 # "", "DequantizeLinear" or "Cast": the node between them
    shape: tuple             # the weight's shape
    operand: int             # which input of the node reads it
    transposed: bool         # its matrix (rows = outputs) is the transpose of its 2-D shape
    depthwise: bool = False
    dequantize: onnx.NodeProto | None = field(default=None, repr=False)

    @property
    def matrix_shape(self) -> tuple[int, int]:
        if self.op == "Conv":
            return self.shape[0], int(np.prod(self.shape[1:]))
        return self.shape[::-1] if self.transposed else self.shape

    def to_matrix(self, w: np.ndarray) -> np.ndarray:
        """(outputs, reduction): Conv's (M, C/g, *k) as (M, (*k, C/g)), input channels fastest."""
        if self.op == "Conv":
            return np.moveaxis(w, 1, -1).reshape(w.shape[0], -1)
        return w.T if self.transposed else w

    def from_matrix(self, m: np.ndarray) -> np.ndarray:
        if self.op == "Conv":
            moved = (self.shape[0],) + tuple(self.shape[2:]) + (self.shape[1],)
            return np.moveaxis(m.reshape(moved), -1, 1)
        return m.T if self.transposed else m


def constant_tensors(model: onnx.ModelProto) -> dict[str, onnx.TensorProto]:
    """Every constant of the main graph by name: initializers and Constant nodes' values
    (the protos themselves: changing one changes the model)."""
    found = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value":
                    found[node.output[0]] = attr.t
    return found


FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16,
               onnx.TensorProto.DOUBLE}


def _source(name: str, producers: dict, tensors: dict):
    """(constant tensor name, the node between it and the layer or None) behind `name`, or None
    when it is computed."""
    if name in tensors:
        return name, None
    node = producers.get(name)
    if node is None or not node.input or node.input[0] not in tensors:
        return None
    if node.op_type == "Cast" and tensors[node.input[0]].data_type in FLOAT_TYPES and \
            _attr(node, "to", 0) in FLOAT_TYPES:
        return node.input[0], node
    if node.op_type == "DequantizeLinear" and all(i in tensors for i in node.input[1:] if i) \
            and not any(a.name == "block_size" and a.i for a in node.attribute):
        return node.input[0], node
    return None


def _attr(node: onnx.NodeProto, name: str, default):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def find_layers(model: onnx.ModelProto) -> list[Layer]:
    """Every Conv, Gemm and MatMul of the main graph whose weight is constant, in node order."""
    tensors = constant_tensors(model)
    producers = {o: n for n in model.graph.node for o in n.output}
    layers = []
    for i, node in enumerate(model.graph.node):
        candidates = {"Conv": [(1, False)], "Gemm": [(1, not _attr(node, "transB", 0))],
                      "MatMul": [(1, True), (0, False)]}.get(node.op_type, [])
        for operand, transposed in candidates:
            if len(node.input) <= operand:
                continue
            found = _source(node.input[operand], producers, tensors)
            if found is None:
                continue
            name, between = found
            shape = tuple(tensors[name].dims)
            if len(shape) != 2 and not (node.op_type == "Conv" and len(shape) >= 3):
                continue
            group = _attr(node, "group", 1)
            layers.append(Layer(
                node.name or f"{node.op_type}_{i}", node.op_type, name,
                between.op_type if between is not None else "", shape, operand, transposed,
                depthwise=node.op_type == "Conv" and group > 1 and shape[1] == 1,
                dequantize=between if between is not None and
                between.op_type == "DequantizeLinear" else None))
            break
    return layers


def _dequantized(layer: Layer, q: np.ndarray, tensors: dict) -> tuple[np.ndarray, np.ndarray]:
    """(the weight's float values, its zero point broadcast to its shape)."""
    node = layer.dequantize
    scale = numpy_helper.to_array(tensors[node.input[1]]).astype(np.float64)
    zero = numpy_helper.to_array(tensors[node.input[2]]) if len(node.input) > 2 and \
        node.input[2] else np.zeros((), q.dtype)
    if scale.size > 1 or scale.ndim == 1:
        shape = [1] * q.ndim
        shape[_attr(node, "axis", 1) % q.ndim] = -1
        scale, zero = scale.reshape(shape), zero.reshape(shape)
    zero = np.broadcast_to(zero, q.shape).astype(q.dtype)
    return (q.astype(np.float64) - zero.astype(np.float64)) * scale, zero


def zero_fraction(layer: Layer, tensors: dict) -> float:
    """The fraction of the layer's weights that are zero (dequantized: at the zero point)."""
    w = numpy_helper.to_array(tensors[layer.weight])
    if layer.dequantize is not None:
        w = _dequantized(layer, w, tensors)[0]
    return float(np.count_nonzero(w == 0) / w.size) if w.size else 0.0


# ---------------------------------------------------------------------------------------------
# Pruning

@dataclass
class LayerReport:
    """One layer's weight before and after pruning."""

    node: str
    op: str
    weight: str
    shape: tuple
    before: float            # zero fraction
    after: float
    dense: str = ""          # why it was left dense: "kept" or "depthwise"; "" if pruned


@dataclass
class Pruning:
    """`prune`'s result: the pruned copy of the model and a report per layer."""

    model: onnx.ModelProto
    pattern: Pattern
    sparsity: float
    layers: list[LayerReport]

    @property
    def zeros(self) -> tuple[int, int]:
        """(zero weights, weights) over every layer found, pruned or not."""
        sizes = [int(np.prod(r.shape)) for r in self.layers]
        return round(sum(s * r.after for s, r in zip(sizes, self.layers))), sum(sizes)


def _check_sparsity(sparsity, pattern: Pattern) -> float:
    fixed = pattern.fixed_sparsity
    if sparsity is None:
        if fixed is None:
            raise ArgumentError(f"sparsity is needed with pattern {pattern.text} (a fraction "
                                f"in [0, 1): 0.9 zeroes 90% of each layer's weights)")
        return fixed
    if isinstance(sparsity, bool) or not isinstance(sparsity, Real) or not 0 <= sparsity < 1:
        raise ArgumentError(f"sparsity must be a number in [0, 1) (0.9: 90% of each layer's "
                            f"weights zero), not {sparsity!r}")
    if fixed is not None and abs(sparsity - fixed) > 1e-9:
        raise ArgumentError(f"pattern {pattern.text} keeps {pattern.keep} of every "
                            f"{pattern.group} weights: sparsity {fixed:g}, not {sparsity:g} "
                            f"(leave sparsity out, or use unstructured or block pruning)")
    return float(sparsity)


def _check_keep(keep, layers: list[Layer]) -> set[str]:
    if isinstance(keep, str) or not all(isinstance(k, str) for k in keep):
        raise ArgumentError("keep must be a list of node or weight names")
    names = {l.node for l in layers} | {l.weight for l in layers}
    unknown = [k for k in keep if k not in names]
    if unknown:
        some = ", ".join(l.node for l in layers[:8]) + (", ..." if len(layers) > 8 else "")
        raise ArgumentError(f"keep: {', '.join(map(repr, unknown))} is neither a layer's node "
                            f"nor its weight's name; the layers are {some or 'none'}")
    return set(keep)


def prune(model: onnx.ModelProto, sparsity: float | None = None,
          pattern: str = "unstructured", *, keep=(), include_depthwise: bool = False,
          progress: bool | None = None) -> Pruning:
    """A copy of `model` whose Conv, Gemm and MatMul weights are magnitude-pruned to
    `sparsity` per layer in `pattern` (module docstring), with a report per layer. `keep`:
    node or weight names left dense; depthwise convolutions stay dense unless
    `include_depthwise`. An N:M pattern implies its sparsity (`sparsity` may be left out).
    `progress` (default: when stderr is a terminal) shows each layer as it is pruned."""
    if not isinstance(model, onnx.ModelProto):
        raise ArgumentError(f"model must be an onnx.ModelProto, not {type(model).__name__}")
    check_optional_bool("include_depthwise", include_depthwise)
    check_optional_bool("progress", progress)
    parsed = parse_pattern(pattern)
    sparsity = _check_sparsity(sparsity, parsed)
    pruned = onnx.ModelProto()
    pruned.CopyFrom(model)
    layers = find_layers(pruned)
    kept = _check_keep(keep, layers)
    tensors = constant_tensors(pruned)
    why = {}
    for layer in layers:
        why[layer.node] = "kept" if kept & {layer.node, layer.weight} else \
            "depthwise" if layer.depthwise and not include_depthwise else ""
    _check_divisible(parsed, [l for l in layers if not why[l.node]])
    before = {l.node: zero_fraction(l, tensors) for l in layers}
    done: dict[str, Layer] = {}
    todo = [l for l in layers if not why[l.node]]
    shown = sys.stderr.isatty() if progress is None else progress
    if shown:
        log.info(f"pruning {len(todo)} of {len(layers)} layers ({parsed.text}, sparsity "
                 f"{sparsity:g})")
    with Progress(len(todo), shown, unit="layer") as bar:
        for layer in todo:
            bar.step(f"pruning {layer.node} ({layer.op}, {'x'.join(map(str, layer.shape))})",
                     detail=True)
            if done.setdefault(layer.weight, layer) is layer:   # a shared weight: pruned once
                _prune_layer(layer, tensors, parsed, sparsity)
            bar.done()
    reports = [LayerReport(l.node, l.op, l.weight, l.shape, before[l.node],
                           zero_fraction(l, tensors), why[l.node]) for l in layers]
    return Pruning(pruned, parsed, sparsity, reports)


def prune_model(model: onnx.ModelProto, sparsity: float | None = None,
                pattern: str = "unstructured", *, keep=(),
                include_depthwise: bool = False) -> onnx.ModelProto:
    """`prune(...).model`: the pruned copy alone."""
    return prune(model, sparsity, pattern, keep=keep,
                 include_depthwise=include_depthwise).model


def _check_divisible(pattern: Pattern, layers: list[Layer]) -> None:
    """Every layer to prune has axes the pattern's groups or blocks divide; else one error
    naming each layer that has not."""
    if pattern.kind == "unstructured":
        return
    bad = [l for l in layers if not pattern.divides(*l.matrix_shape)]
    if bad:
        listed = ", ".join(f"{l.node} ({l.op}, {l.matrix_shape[0]} outputs x "
                           f"{l.matrix_shape[1]} reduction)" for l in bad[:6])
        more = f" and {len(bad) - 6} more" if len(bad) > 6 else ""
        raise ArgumentError(f"pattern {pattern.text} needs {pattern.needs()}, which "
                            f"{len(bad)} layer(s) lack: {listed}{more}; leave them dense "
                            f"with keep (--keep NAME)")


def _prune_layer(layer: Layer, tensors: dict, pattern: Pattern, sparsity: float) -> None:
    """Zero the layer's weight in place (its tensor proto) where `keep_mask` says."""
    proto = tensors[layer.weight]
    w = numpy_helper.to_array(proto)
    if layer.dequantize is not None:
        values, zero = _dequantized(layer, w, tensors)
    else:
        values, zero = w.astype(np.float64), np.zeros(w.shape, w.dtype)
    mask = layer.from_matrix(keep_mask(np.abs(layer.to_matrix(values)), pattern, sparsity))
    proto.CopyFrom(numpy_helper.from_array(np.where(mask, w, zero).astype(w.dtype),
                                           proto.name))


# ---------------------------------------------------------------------------------------------
# What pruning costs

@dataclass
class OutputError:
    """How far a pruned model's output is from the dense model's, over the samples."""

    name: str
    max_abs: float
    relative: float          # ||pruned - dense|| / ||dense|| (L2, over every sample)
    top1: float | None       # rows whose argmax agrees, for (batch, classes) outputs


def _runner(model: onnx.ModelProto, reference: str):
    if reference == "onnxruntime":
        try:
            import onnxruntime as ort
        except ImportError:
            raise ArgumentError("reference onnxruntime: onnxruntime is not installed "
                                "(pip install onnxruntime), use the numpy reference") from None
        try:
            session = ort.InferenceSession(model.SerializeToString(),
                                           providers=["CPUExecutionProvider"])
        except Exception as exc:   # its own exception types, for a model it cannot run
            raise ArgumentError(f"reference onnxruntime cannot run the model "
                                f"({type(exc).__name__}: {str(exc)[:300]}); use the numpy "
                                f"reference") from exc
        return lambda feeds: session.run(None, feeds)
    from ..frontend.onnx import import_onnx
    from ..ir.interpreter import run_graph

    graph = import_onnx(model)
    return lambda feeds: [np.asarray(a) for a in run_graph(graph, [feeds[v.name]
                                                                   for v in graph.inputs])]


def output_error(dense: onnx.ModelProto, pruned: onnx.ModelProto, samples: int = 4,
                 seed: int = 0, reference: str = REFERENCES[0], dims: dict | None = None,
                 progress: bool | None = None) -> list[OutputError]:
    """Each output's error of `pruned` against `dense` on `samples` seeded random inputs
    (`zoo.inputs_for`: normal floats, ids below a zoo model's vocabulary; symbolic dims from
    `dims`, else 1), both run on `reference` (REFERENCES). `progress` (default: when stderr
    is a terminal) shows each run."""
    from .. import zoo

    check_int("samples", samples, 1)
    check_int("seed", seed, 0)
    check_choice("reference", reference, REFERENCES)
    check_optional_bool("progress", progress)
    shown = sys.stderr.isatty() if progress is None else progress
    names = [o.name for o in dense.graph.output]
    diffs: list[list[np.ndarray]] = [[] for _ in names]
    wants: list[list[np.ndarray]] = [[] for _ in names]
    rng = np.random.default_rng(seed)
    with Progress(2 * samples, shown, unit="run") as bar:
        runs = []
        for label, model in (("dense", dense), ("pruned", pruned)):
            bar.step(f"preparing the {label} model on {reference}")
            runs.append(_runner(model, reference))
        for i in range(samples):
            feeds = zoo.inputs_for(dense, rng, dims)
            outs = []
            for label, run in zip(("dense", "pruned"), runs):
                bar.step(f"sample {i + 1} of {samples}: the {label} model on {reference}")
                outs.append(run(feeds))
                bar.done()
            for k, (want, got) in enumerate(zip(*outs)):
                wants[k].append(np.asarray(want, np.float64))
                diffs[k].append(np.asarray(got, np.float64) - wants[k][-1])
    return [_error(name, want, diff) for name, want, diff in zip(names, wants, diffs)]


def _error(name: str, want: list[np.ndarray], diff: list[np.ndarray]) -> OutputError:
    w = np.concatenate([a.ravel() for a in want])
    d = np.concatenate([a.ravel() for a in diff])
    norm = float(np.linalg.norm(w))
    top1 = None
    if all(a.ndim == 2 and a.shape[1] > 1 for a in want):
        agree = [np.argmax(a, 1) == np.argmax(a + e, 1) for a, e in zip(want, diff)]
        top1 = float(np.mean(np.concatenate(agree)))
    return OutputError(name, float(np.max(np.abs(d))) if d.size else 0.0,
                       float(np.linalg.norm(d)) / norm if norm else float(np.linalg.norm(d)),
                       top1)
