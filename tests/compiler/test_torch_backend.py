"""The torch.compile backend (`dnnc/compiler/torch_backend.py`, importing through
`frontend/torch_fx.py`): modules compiled by `torch.compile(backend="dnnc")` against eager on
seeded random inputs, partitions around what dnnc does not take, graph breaks, dynamic batch,
frozen weights. Skips without torch; `import dnnc` must never need it."""

import importlib
import importlib.metadata
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

from dnnc.errors import ArgumentError
from dnnc.testing.optional import library

torch = pytest.importorskip("torch")
nn = torch.nn

from dnnc.compiler import torch_backend  # noqa: E402
from dnnc.compiler.torch_backend import dnnc_backend  # noqa: E402
from torch_modules import Block, SmallCNN, randomize_batch_norm  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def compiled(module, **options):
    torch._dynamo.reset()
    return torch.compile(module, backend=dnnc_backend, options=options or None)


def new_reports(before: int):
    return torch_backend.reports()[before:]


def check(module, *inputs, atol=1e-4, **options):
    """`module` compiled by the backend gives eager's outputs; the reports of its graphs."""
    module.eval()
    before = len(torch_backend.reports())
    with torch.no_grad():
        want = module(*inputs)
        got = compiled(module, **options)(*inputs)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=atol)
    return new_reports(before)


def test_import_dnnc_never_imports_torch():
    code = "import sys, dnnc; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_entry_point_names_the_backend():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    target = project["project"]["entry-points"]["torch_dynamo_backends"]["dnnc"]
    module, name = target.split(":")
    assert getattr(importlib.import_module(module), name) is dnnc_backend
    installed = [e for e in importlib.metadata.entry_points(group="torch_dynamo_backends")
                 if e.name == "dnnc"]
    if not installed:
        pytest.skip("dnnc is installed without its entry point: pip install -e . again")
    torch._dynamo.reset()
    layer = nn.Linear(4, 3).eval()
    x = torch.randn(2, 4)
    with torch.no_grad():
        np.testing.assert_allclose(torch.compile(layer, backend="dnnc")(x).numpy(),
                                   layer(x).numpy(), rtol=1e-5, atol=1e-6)


def test_mlp_runs_in_one_partition_with_frozen_weights():
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8), nn.Sigmoid(),
                        nn.Linear(8, 4), nn.Tanh())
    (report,) = check(mlp, torch.randn(5, 16))
    assert report.partitions == 1 and sum(report.torch_ops.values()) == 0
    (model,) = report.models
    assert len(model.input_names) == 1   # the weights are constants, not inputs
    assert report.direct_call   # dynamo's arguments go straight to the partitions


@pytest.mark.parametrize("flag", [None, "prepare_freezing"])
def test_each_module_runs_its_own_weights(flag):
    """Two modules of one class compiled in turn: dynamo keeps its compiles per code object
    and, unguarded, the second module's call passed the first's guards (which check the
    weights' shapes) and ran the first's frozen weights. The backend guards the frozen
    weights' identity (`_guard_identity`): the second compiles on its own, and so does the
    first again after a parameter is replaced."""
    torch.manual_seed(0)
    first, second = (nn.Sequential(nn.Linear(6, 5), nn.ReLU()).eval() for _ in range(2))
    x = torch.randn(2, 6)
    before = len(torch_backend.reports())
    torch._dynamo.reset()
    with torch._dynamo.config.patch(**({flag: True} if flag else {})), torch.no_grad():
        for module in (first, second, first):
            got = torch.compile(module, backend=dnnc_backend)(x)
            np.testing.assert_allclose(got.numpy(), module(x).numpy(), rtol=1e-5, atol=1e-6)
        assert len(new_reports(before)) == 2
        first[0].weight = nn.Parameter(torch.randn(5, 6))
        got = torch.compile(first, backend=dnnc_backend)(x)
        np.testing.assert_allclose(got.numpy(), first(x).numpy(), rtol=1e-5, atol=1e-6)
    assert len(new_reports(before)) == 3


def test_an_output_that_views_an_input_keeps_aot_autograds_wrapper():
    class Views(nn.Module):
        def forward(self, x):
            return x.view(-1), torch.relu(x) * 2

    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    before = len(torch_backend.reports())
    with torch.no_grad():
        flat, doubled = compiled(Views())(x)
    (report,) = new_reports(before)
    assert not report.direct_call
    assert flat.data_ptr() == x.data_ptr()   # a view of the input, as in eager
    np.testing.assert_allclose(doubled.numpy(), torch.relu(x).numpy() * 2, rtol=1e-6)


def test_small_cnn_conv_batchnorm_pools():
    torch.manual_seed(0)
    (report,) = check(randomize_batch_norm(SmallCNN()), torch.randn(2, 3, 20, 20))
    assert report.partitions == 1 and sum(report.torch_ops.values()) == 0


def test_transformer_block():
    torch.manual_seed(0)
    (report,) = check(Block(), torch.randn(2, 7, 32))
    assert report.partitions == 1 and sum(report.torch_ops.values()) == 0


def test_transformer_block_with_symbolic_batch_and_length():
    torch.manual_seed(0)
    block = Block().eval()
    before = len(torch_backend.reports())
    fn = compiled(block)
    with torch.no_grad():
        for batch, length in ((2, 7), (3, 5), (4, 9)):
            x = torch.randn(batch, length, 32)
            np.testing.assert_allclose(fn(x).numpy(), block(x).numpy(), rtol=1e-4, atol=1e-5)
    static, dynamic = new_reports(before)
    (model,) = dynamic.models
    assert [type(d) for d in model.input_types[0].shape] == [str, str, int]
    assert sum(dynamic.torch_ops.values()) == 0   # (the sizes' arithmetic is no tensor op)


def test_activations_torch_decomposes_are_imported_whole():
    F = nn.functional

    class Activations(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 6, 1)

        def forward(self, x):
            x = self.conv(x)
            y = F.hardswish(x) + F.hardsigmoid(x) + F.silu(x) + F.mish(x) + F.softplus(x)
            y = y + F.elu(x, 0.5) + F.relu6(x * 4) + F.hardtanh(x, -0.5, 0.25) + F.selu(x)
            se = y.mean((2, 3), keepdim=True)   # a squeeze-and-excitation's pooling
            return y * torch.sigmoid(se) + y.mean((-1, -2))[..., None, None]

    torch.manual_seed(0)
    (report,) = check(Activations(), torch.randn(2, 3, 5, 5) * 3)
    assert sum(report.torch_ops.values()) == 0
    ops = {n.op for n in report.models[0].graph.nodes}
    assert {"HardSwish", "HardSigmoid", "GlobalAveragePool"} <= ops, ops


def test_scaled_dot_product_attention():
    class Attention(nn.Module):
        def forward(self, q, k, v):
            return nn.functional.scaled_dot_product_attention(q, k, v)

    torch.manual_seed(0)
    check(Attention(), *(torch.randn(2, 2, 6, 8) for _ in range(3)))


def test_advanced_indexing_and_boolean_masks():
    class Indexing(nn.Module):
        def forward(self, x, i, j, mask):
            leading, middle, single = x[i, j], x[:, i[:, None], j], x[:, :, j]
            masks = (mask & (x > 0)).float() + (mask | (x < 0)).float()
            return leading.sum() + middle.sum(0) * 2 + single.sum() * 3 + masks.sum()

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 5, 6, generator=gen)
    i, j = torch.tensor([0, 3, -1]), torch.tensor([1, 2, 4])   # (-1: the last, as in torch)
    (report,) = check(Indexing(), x, i, j, torch.rand(4, 5, 6, generator=gen) > 0.5)
    assert report.partitions == 1 and sum(report.torch_ops.values()) == 0


def test_as_strided_of_a_contiguous_tensor():
    class Strided(nn.Module):
        def forward(self, x):
            window = torch.as_strided(x + 1, (3, 2, 2), (2, 1, 1), 1)   # overlapping reads
            same = torch.as_strided(x * 2, (1, 8, 1, 1), (8, 1, 8, 8))   # a restride: a view
            return window.sum(0), same.flatten()

    x = torch.randn(1, 8, 1, 1, generator=torch.Generator().manual_seed(0))
    module = Strided()
    before = len(torch_backend.reports())
    with torch.no_grad():
        got, want = compiled(module)(x), module(x)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-6)
    (report,) = new_reports(before)
    assert sum(report.torch_ops.values()) == 0


def test_unsupported_op_stays_in_torch_between_partitions():
    class Sorting(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 3)

        def forward(self, x):
            return self.b(torch.sort(torch.relu(self.a(x)), dim=-1).values)

    torch.manual_seed(0)
    (report,) = check(Sorting(), torch.randn(4, 8))
    assert report.torch_ops == {"aten.sort.default": 1}
    assert report.partitions == 2


class Counting(nn.Module):
    """A buffer the forward writes: how many calls it has seen."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls.add_(1)
        return self.fc(x) * self.calls


def test_a_buffer_the_graph_writes_is_not_frozen():
    torch.manual_seed(0)
    model = Counting().eval()
    twin = Counting().eval()
    twin.load_state_dict(model.state_dict())
    fn = compiled(twin)
    x = torch.randn(2, 4)
    with torch.no_grad():
        for _ in range(3):   # a frozen counter would give call 1's result every time
            np.testing.assert_allclose(fn(x).numpy(), model(x).numpy(), rtol=1e-5,
                                       atol=1e-6)
    assert float(twin.calls) == 3
    # the write is the graph's own (a copy_ into the buffer), made by dnnc's partition: its
    # output written into the buffer (`Graph.aliases`; an Add, so copied there after the
    # call), nothing left in torch, no wrapper needed
    report = torch_backend.reports()[-1]
    assert report.direct_call and not report.torch_ops, report.torch_ops
    assert len(report.models[0].graph.aliases) == 1


def test_weights_dynamo_leaves_as_attributes_are_frozen_too():
    """With `inline_inbuilt_nn_modules` off (torch 2.11: torch 2.13 ignores it), dynamo
    keeps torch.nn modules' parameters and buffers as attributes of its graph and
    aot_autograd lifts them to the front of the inputs: they are constants of the compile all
    the same (were: inputs, BatchNorm left unfolded), and a buffer the graph writes is still
    written."""
    held = []

    def spy(gm, example_inputs, options=None):
        held.append(len(list(gm.parameters())))
        return dnnc_backend(gm, example_inputs, options)

    torch.manual_seed(0)
    cnn = randomize_batch_norm(SmallCNN()).eval()
    x = torch.randn(2, 3, 20, 20)
    before = len(torch_backend.reports())
    with torch._dynamo.config.patch(inline_inbuilt_nn_modules=False), torch.no_grad():
        torch._dynamo.reset()
        got = torch.compile(cnn, backend=spy)(x)
        if not held[0]:
            pytest.skip("this torch passes every weight as an input (always inlines modules)")
        np.testing.assert_allclose(got.numpy(), cnn(x).numpy(), rtol=1e-4, atol=1e-4)
        (report,) = new_reports(before)
        (model,) = report.models
        assert len(model.input_names) == 1   # the image; every weight a constant
        assert not report.direct_call   # aot_autograd's call adds the lifted weights
        model = Counting().eval()
        twin = Counting().eval()
        twin.load_state_dict(model.state_dict())
        fn = compiled(twin)
        y = torch.randn(2, 4)
        for _ in range(3):
            np.testing.assert_allclose(fn(y).numpy(), model(y).numpy(), rtol=1e-5, atol=1e-6)
    assert float(twin.calls) == 3


SHIFT = torch.full((6,), 0.5)   # a global tensor the module reads


class Attributes(nn.Module):
    """Weights of each kind dynamo may make attributes of its graph: parameters, a
    BatchNorm's buffers, a tensor attribute that is no buffer (`scale`), a global (`SHIFT`)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(5, 6)
        self.norm = nn.BatchNorm1d(6)
        self.scale = torch.full((6,), 2.0)

    def forward(self, x):
        return self.norm(self.fc(x)) * self.scale + SHIFT


@pytest.mark.parametrize("flag", ["prepare_freezing", "install_free_tensors"])
def test_only_a_modules_weights_dynamo_makes_attributes_are_frozen(flag):
    """Under dynamo's `prepare_freezing` (or `install_free_tensors`) the module's weights are
    attributes of dynamo's graph, which aot_autograd lifts in front of its inputs. The
    module's parameters and buffers are constants of the compile (a change after it is not
    seen, as without the flag); its other tensors, the global and the plain attribute, stay
    live arguments, read at every call as they are where dynamo passes them (were frozen)."""
    held = []

    def spy(gm, example_inputs, options=None):
        held.append(len(dict(gm.named_parameters())))
        return dnnc_backend(gm, example_inputs, options)

    torch.manual_seed(0)
    module = Attributes().eval()
    module.norm.running_mean.normal_(generator=torch.Generator().manual_seed(1))
    x = torch.randn(3, 5)
    before = len(torch_backend.reports())
    with torch._dynamo.config.patch(**{flag: True}), torch.no_grad():
        torch._dynamo.reset()
        fn = torch.compile(module, backend=spy)
        np.testing.assert_allclose(fn(x).numpy(), module(x).numpy(), rtol=1e-5, atol=1e-5)
    if not held[0]:
        pytest.skip(f"this torch passes the weights as arguments under {flag}")
    (report,) = new_reports(before)
    (model,) = report.models
    assert not report.torch_ops
    assert len(model.input_names) == 3   # x, scale, SHIFT; the parameters, buffers constants
    with torch.no_grad():
        want = module(x)
        module.scale.mul_(3)
        SHIFT.add_(1)
        try:
            np.testing.assert_allclose(fn(x).numpy(), (want - 0.5) * 3 + 1.5,
                                       rtol=1e-5, atol=1e-5)
            module.fc.weight.mul_(2)   # frozen: not seen (docs/torch_backend.md)
            module.norm.running_mean.add_(1)
            np.testing.assert_allclose(fn(x).numpy(), (want - 0.5) * 3 + 1.5,
                                       rtol=1e-5, atol=1e-5)
        finally:
            SHIFT.sub_(1)


class Cache(nn.Module):
    """A static cache written at `pos` each call (as transformers' StaticCache is) and read
    after the write; with `early`, its old value read before the write too."""

    def __init__(self, early: bool, width: int = 4):
        super().__init__()
        self.fc = nn.Linear(4, width)
        self.register_buffer("cache", torch.zeros(2, 6, width))
        self.early = early

    def forward(self, x, pos):
        old = self.cache * 2 if self.early else None
        self.cache[:, pos] = self.fc(x)
        new = torch.relu(self.cache).sum(1)
        return new if old is None else new + old.sum(1)


@pytest.mark.parametrize("early", [False, True])
def test_a_cache_write_is_compiled_and_writes_the_cache_itself(early):
    """copy_(cache, index_put(cache, pos, v)): the write is dnnc's (IndexCopy), in the one
    partition, its output written into the cache tensor (`Graph.aliases`) instead of a new
    cache torch copies back; computed in place where only the write reads the old cache, else
    (`early`) copied into it after the call. The cache as eager's after every step."""
    torch.manual_seed(0)
    model, twin = Cache(early).eval(), Cache(early).eval()
    twin.load_state_dict(model.state_dict())
    fn = compiled(twin)
    cache = twin.cache
    with torch.no_grad():
        for step in range(4):
            x, pos = torch.randn(2, 1, 4), torch.tensor([step])
            np.testing.assert_allclose(fn(x, pos).numpy(), model(x, pos).numpy(),
                                       rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(twin.cache.numpy(), model.cache.numpy(), rtol=1e-5,
                                       atol=1e-6)
    assert twin.cache is cache
    report = torch_backend.reports()[-1]
    assert report.partitions == 1 and not report.torch_ops and report.direct_call, \
        report.torch_ops
    (dnnc_model,) = report.models
    assert len(dnnc_model.graph.aliases) == 1
    (segment,) = dnnc_model.runtime.compiled_segments()
    assert bool(segment.in_place) == (not early)


def test_a_prompt_of_any_length_writes_the_cache_on_the_target():
    """The cache written at a prompt's positions, their count symbolic (torch.compile's
    dynamic shapes, as dynamo makes a prefill's length after it has seen two): the IndexCopy
    is a kernel (its staged form), not a step on the host, and the cache is eager's after
    prompts of several lengths, one longer than INDEX_COPY_MOST positions of a 6-row cache
    (repeats: the last write wins)."""
    from dnnc.ir.ops.indexing import INDEX_COPY_MOST

    torch.manual_seed(0)
    model, twin = Cache(False).eval(), Cache(False).eval()
    twin.load_state_dict(model.state_dict())
    torch._dynamo.reset()
    before = len(torch_backend.reports())
    fn = torch.compile(twin, backend=dnnc_backend, dynamic=True)
    with torch.no_grad():
        for length in (3, 5, INDEX_COPY_MOST + 2):
            x, pos = torch.randn(2, length, 4), torch.arange(length) % 6
            np.testing.assert_allclose(fn(x, pos).numpy(), model(x, pos).numpy(),
                                       rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(twin.cache.numpy(), model.cache.numpy(), rtol=1e-5,
                                       atol=1e-6)
    reports = new_reports(before)
    assert reports and all(m.stats["host_fallback_ops"] == 0
                           for r in reports for m in r.models)
    assert any(not v.type.is_static for r in reports for m in r.models
               for v in m.graph.inputs)   # (the positions' count symbolic)


def test_import_names_every_node_it_cannot_take():
    from torch.fx.experimental.proxy_tensor import make_fx

    from dnnc.errors import UnsupportedOpError
    from dnnc.frontend.torch_fx import import_fx

    def fn(x):
        return torch.sort(torch.relu(x)).values + torch.cumprod(x, 0)

    gm = make_fx(fn, tracing_mode="fake")(torch.randn(3, 4))
    listed = r"2 ATen op(?s:.*)aten.sort.default: nodes 'sort'(?s:.*)aten.cumprod"
    with pytest.raises(UnsupportedOpError, match=listed):
        import_fx(gm)


def test_graph_break_runs_both_graphs():
    class Printing(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(6, 6), nn.Linear(6, 2)

        def forward(self, x):
            x = torch.relu(self.a(x))
            if x.sum().item() > -1e9:   # .item(): a graph break
                print("x", x.shape)
            return self.b(x)

    torch.manual_seed(0)
    reports = check(Printing(), torch.randn(3, 6))
    assert len(reports) == 2 and all(r.partitions >= 1 for r in reports)


def test_new_batch_sizes_reuse_the_dynamic_compile():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4)).eval()
    before = len(torch_backend.reports())
    fn = compiled(model)
    with torch.no_grad():
        for batch in (2, 3, 5, 9):
            x = torch.randn(batch, 8)
            np.testing.assert_allclose(fn(x).numpy(), model(x).numpy(), rtol=1e-4, atol=1e-5)
    reports = new_reports(before)
    assert len(reports) == 2   # batch 2, then one dynamic compile for every other batch
    (dynamic,) = reports[1].models
    assert isinstance(dynamic.input_types[0].shape[0], str)


def test_outputs_are_tensors_over_dnnc_arrays_and_carry_no_grad():
    torch.manual_seed(0)
    layer = nn.Linear(4, 4)
    x = torch.randn(3, 4)
    out = compiled(layer)(x)   # grad enabled, weights requiring it
    assert isinstance(out, torch.Tensor) and not out.requires_grad
    with torch.no_grad():
        np.testing.assert_allclose(out.numpy(), layer(x).numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_modules_run_in_their_own_type(dtype):
    dtype = getattr(torch, dtype)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.GELU(), nn.Linear(16, 4)).to(dtype).eval()
    x = torch.randn(3, 16, dtype=dtype)
    before = len(torch_backend.reports())
    with torch.no_grad():
        got, want = compiled(model)(x), model(x)
    assert got.dtype == dtype
    np.testing.assert_allclose(got.float().numpy(), want.float().numpy(), rtol=0.05,
                               atol=0.05)
    (report,) = new_reports(before)
    assert report.partitions == 1 and not report.failed


def test_options_reach_the_compile_and_unknown_ones_are_refused():
    torch.manual_seed(0)
    (report,) = check(nn.Sequential(nn.Linear(32, 32), nn.ReLU()), torch.randn(4, 32),
                      atol=0.1, precision="bf16")
    assert report.models[0].stats["precision"] == "bf16"
    with pytest.raises(ArgumentError, match="unknown precisoin"):
        torch_backend.check_backend_options({"precisoin": "bf16"})


def test_torchvision_resnet18():
    torchvision = library("torchvision", "models")
    torch.manual_seed(0)
    model = randomize_batch_norm(torchvision.models.resnet18())
    (report,) = check(model, torch.randn(1, 3, 64, 64), atol=1e-3)
    assert report.partitions == 1 and sum(report.torch_ops.values()) == 0


def test_transformers_bert_built_locally():
    transformers = library("transformers", "BertConfig", "BertModel")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=64,
                                     max_position_embeddings=64)
    bert = transformers.BertModel(config).eval()
    ids = torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(2))
    before = len(torch_backend.reports())
    with torch.no_grad():
        want = bert(input_ids=ids).last_hidden_state
        got = compiled(bert)(input_ids=ids).last_hidden_state
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-4)
    assert all(sum(r.torch_ops.values()) == 0 for r in new_reports(before))



DECODERS = {
    "gpt2": ("GPT2Config", "GPT2LMHeadModel",
             {"n_layer": 2, "n_embd": 64, "n_head": 4, "n_positions": 64}),
    "llama": ("LlamaConfig", "LlamaForCausalLM",
              {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128,
               "num_attention_heads": 4, "num_key_value_heads": 2,
               "max_position_embeddings": 64}),
}


@pytest.mark.parametrize("name", sorted(DECODERS))
def test_static_cache_generate_compiles_prefill_and_decode_once(name):
    """transformers' generate with a static KV cache: one graph for the prompt, one for every
    decode step after it (the cache an input the graph writes, not a new shape per token),
    eager's greedy tokens, and eager's keys and values in the cache tensors at the end."""
    config_name, model_name, sizes = DECODERS[name]
    transformers = library("transformers", config_name, model_name)
    config = getattr(transformers, config_name)(vocab_size=500, bos_token_id=1,
                                                eos_token_id=2, **sizes)
    torch.manual_seed(0)
    model = getattr(transformers, model_name)(config).eval()
    ids = torch.randint(3, 500, (2, 8), generator=torch.Generator().manual_seed(1))
    options = {"max_new_tokens": 8, "do_sample": False, "pad_token_id": 0,
               "eos_token_id": None}
    caches = [transformers.StaticCache(config=config, max_cache_len=16) for _ in range(2)]
    with torch.no_grad():
        want = model.generate(ids, past_key_values=caches[0], **options)
        torch._dynamo.reset()
        before = len(torch_backend.reports())
        model.forward = torch.compile(model.forward, backend=dnnc_backend)
        got = model.generate(ids, past_key_values=caches[1], **options)
    for eager, ours in zip(*(c.layers for c in caches)):
        for name in ("keys", "values"):
            np.testing.assert_allclose(getattr(ours, name).numpy(),
                                       getattr(eager, name).numpy(), rtol=1e-4, atol=1e-5)
    assert got.shape == (2, 16) and len(set(want[:, 8:].flatten().tolist())) > 2
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    prefill, decode = new_reports(before)   # 8 tokens, 2 compiles
    # each graph one dnnc partition, nothing left to torch: the decode step's cache writes
    # (2 layers' keys and values) computed in place in the cache tensors (the prefill makes
    # the caches: transformers allocates them at their first write)
    assert all(r.partitions == 1 and not r.torch_ops for r in (prefill, decode)), \
        [r.torch_ops for r in (prefill, decode)]
    (segment,) = decode.models[0].runtime.compiled_segments()
    # every write computed in place: the caches, and the counters beside them (after
    # the kernels reading their old values)
    writes = decode.models[0].graph.aliases
    assert len(segment.in_place) == len(writes) >= 4 and decode.direct_call


def test_only_tensors_on_the_partitions_device_are_imported():
    from torch.fx.experimental.proxy_tensor import make_fx

    from dnnc.frontend.torch_fx import supported

    gm = make_fx(lambda x: torch.relu(x) + 1)(torch.empty(3, 4, device="meta"))
    ops = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert all(supported(n) and supported(n, "meta") for n in ops)   # None: any device
    assert not any(supported(n, "cpu") for n in ops)


def test_cuda_tensors_go_to_a_target_of_device_arrays():
    from dnnc.backends.registry import REGISTRY

    gpu = [n for n, s in REGISTRY.items() if s.from_dlpack is not None]
    host = [n for n, s in REGISTRY.items() if s.from_dlpack is None]
    assert gpu and host
    assert torch_backend.placement(gpu[0], "cuda") == torch_backend.Placement(
        "cuda", REGISTRY[gpu[0]].returns[0])
    # a host target leaves CUDA tensors' ops to torch; CPU tensors stay on the host anyway
    assert torch_backend.placement(host[0], "cuda") == torch_backend.HOST
    assert torch_backend.placement(gpu[0], "cpu") == torch_backend.HOST
    assert torch_backend.HOST == torch_backend.Placement("cpu", "numpy")
    chosen = torch_backend.check_backend_options({}, "cuda")["target"]
    assert chosen in (gpu if REGISTRY[gpu[0]].available() else host)
    assert torch_backend.check_backend_options({}, "cpu")["target"] in host
    assert torch_backend.tensor_device([torch.zeros(2), 3]) == "cpu"


def test_a_device_partition_passes_tensors_and_wraps_outputs_without_copies():
    class Model:   # what a CompiledModel of a target returning no tensors is to the partition
        target = "llvm"   # (its registry entry's `returns`: no "torch")

        def run(self, *arrays, to=None):
            self.given, self.to = arrays, to
            self.out = np.arange(6, dtype=np.float32).reshape(2, 3)
            return [self.out]

        def bound_call(self, *arrays, to=None):
            return None

    model = Model()
    x = torch.randn(2, 3, requires_grad=True)
    out = torch_backend.DnncPartition(model, [0], single=True, on_device=True)(x, 7)
    (given,) = model.given
    assert isinstance(given, torch.Tensor) and not given.requires_grad   # the tensor itself
    assert given.data_ptr() == x.data_ptr()
    assert model.to is None
    assert isinstance(out, torch.Tensor)
    assert out.data_ptr() == model.out.ctypes.data   # DLPack: the output's own memory


def test_a_device_partition_asks_a_target_returning_tensors_for_them():
    class Model:   # a cuda CompiledModel: its runtime fills tensors (to="torch")
        target = "cuda"

        def run(self, *arrays, to=None):
            self.to = to
            self.out = [torch.ones(2), torch.zeros(3)]
            return self.out

        def bound_call(self, *arrays, to=None):
            return None

    model = Model()
    a, b = torch_backend.DnncPartition(model, [0], single=False, on_device=True)(
        torch.randn(2))
    assert model.to == "torch"
    assert a is model.out[0] and b is model.out[1]   # handed on as they are


def test_a_host_partition_takes_any_tensor_and_wraps_each_output_by_its_dtype():
    from dnnc.ir import types as T

    class Model:   # what a CompiledModel of host arrays is to the partition
        output_types = [T.TensorType(T.float32, (2, 3)), T.TensorType(T.bfloat16, (2, 3))]

        def run(self, *arrays):
            self.given = arrays
            return [arrays[0] + 1, (arrays[0] * 2).astype(T.bfloat16.np)]

        def bound_call(self, *arrays, to=None):
            raise AssertionError("a partition of a strided tensor with grad binds nothing")

    model = Model()
    x = torch.randn(3, 2, requires_grad=True).t()   # a view with grad, not contiguous
    plus, twice = torch_backend.DnncPartition(model, [0], single=False)(x, 7)
    (given,) = model.given
    assert isinstance(given, np.ndarray) and given.flags.c_contiguous
    np.testing.assert_array_equal(given, x.detach().numpy())
    assert plus.dtype == torch.float32 and twice.dtype == torch.bfloat16
    np.testing.assert_array_equal(plus.numpy(), x.detach().numpy() + 1)
    halved = (x.detach().numpy() * 2).astype(T.bfloat16.np).astype(np.float32)
    np.testing.assert_array_equal(twice.float().numpy(), halved)
    model.output_types = model.output_types[1:]
    model.run = lambda *arrays: [(arrays[0] * 2).astype(T.bfloat16.np)]
    alone = torch_backend.DnncPartition(model, [0], single=True)(x)
    np.testing.assert_array_equal(alone.float().numpy(), halved)


def test_a_partition_of_static_shapes_takes_the_unchecked_path_after_its_first_call():
    """After the first call a host partition of static shapes runs the model's `bound_call`
    (no per-call checks: dynamo's guards fix its arguments); each call's results as eager's,
    each output a tensor of its own."""
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).eval()
    fn = compiled(mlp)
    with torch.no_grad():
        outs = []
        for seed in range(3):
            x = torch.randn(5, 16, generator=torch.Generator().manual_seed(seed))
            outs.append((fn(x), mlp(x)))
    for got, want in outs:
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
    assert len({got.data_ptr() for got, _ in outs}) == 3
    parts = [m for m in torch_backend.reports()[-1].models]
    assert len(parts) == 1 and parts[0].bound_call(np.zeros((5, 16), np.float32)) is not None
    assert parts[0].bound_call(np.zeros((16, 5), np.float32).T) is None   # not C order


def test_a_device_partition_binds_interfaces_made_from_each_tensors_address():
    """A device partition of C-order tensors takes the model's `bound_call` after its first
    call and hands it `DeviceArray`s whose interface is the first call's shape and dtype
    with each call's address, over the tensor itself (the runtime reads its stream)."""
    from dnnc.compiler.module import DeviceArray

    class Model:   # a cuda CompiledModel: its runtime fills tensors (to="torch")
        target = "cuda"

        def run(self, *arrays, to=None):
            return [torch.ones(2)]

        def bound_call(self, *arrays, to=None):
            self.bound_to = to

            def call(arrays):
                self.given = arrays
                return [torch.zeros(2)]
            return call

    model = Model()
    part = torch_backend.DnncPartition(model, [1], single=True, on_device=True)
    assert float(part(7, torch.randn(2, 3)).sum()) == 2   # the first call: `run`
    x = torch.randn(2, 3)
    assert float(part(7, x).sum()) == 0 and model.bound_to == "torch"
    (given,) = model.given
    assert isinstance(given, DeviceArray) and given.obj is x
    assert given.__cuda_array_interface__ == {"shape": (2, 3), "typestr": "<f4",
                                              "strides": None, "version": 3,
                                              "data": (x.data_ptr(), False)}


@pytest.mark.parametrize("tag_guards", [True, False])
def test_guards_by_dict_tags_still_see_a_module_attribute_set_after_the_compile(tag_guards):
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.scale = nn.Linear(6, 4), 2.0

        def forward(self, x):
            return self.fc(x) * self.scale

    config = torch._dynamo.config
    if not hasattr(config, "use_recursive_dict_tags_for_guards"):
        pytest.skip("this torch has no recursive dict tags for guards")
    building = []   # the config while dynamo builds the guards (it filters them first)
    default = config.use_recursive_dict_tags_for_guards   # torch 2.11: True, 2.13: False
    tagged = tag_guards and torch_backend.GUARD_TAGS_SAFE

    def keep_all(entries):
        building.append(config.use_recursive_dict_tags_for_guards)
        return [True] * len(entries)

    torch.manual_seed(0)
    module, x = Scaled().eval(), torch.randn(3, 6)
    before = len(torch_backend.reports())
    fn = compiled(module, tag_guards=tag_guards, guard_filter_fn=keep_all)
    with torch.no_grad():
        fn(x)
        assert building == [tagged]
        assert config.use_recursive_dict_tags_for_guards == default   # for the compile only
        module.scale = 3.0   # the module's dict changes: its guards run, and fail
        np.testing.assert_allclose(fn(x).numpy(), module(x).numpy(), rtol=1e-5, atol=1e-6)
    assert len(new_reports(before)) == 2
    assert config.use_recursive_dict_tags_for_guards == default
