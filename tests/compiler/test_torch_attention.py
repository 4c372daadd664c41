"""torch's fused attention ops imported as dnnc's attention chain (`frontend/torch_attention.py`):
FX graphs of each ATen overload (fake tensors, as aot_autograd hands them over) against
torch's own `scaled_dot_product_attention` on CPU, the chain `fuse_attention` fuses on cuda,
the ops left in torch (dropout, logsumexp read), and a llama decoder whose attention is
lowered as torch lowers it on cuda. Skips without torch."""

import math

import numpy as np
import pytest

from dnnc.testing.optional import library

torch = pytest.importorskip("torch")
F = torch.nn.functional
A = torch.ops.aten

from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402

from dnnc.backends.cuda import FUSION  # noqa: E402
from dnnc.compiler import torch_backend  # noqa: E402
from dnnc.frontend import torch_fx  # noqa: E402
from dnnc.frontend.torch_fx import import_fx, supported  # noqa: E402
from dnnc.ir.interpreter import run_graph  # noqa: E402
from dnnc.ir.target import Target  # noqa: E402
from dnnc.passes.manager import optimize  # noqa: E402

CUDA_LIKE = Target("cuda", arch="sm_90", fusion=FUSION)


def _sdpa(q, k, v, mask, causal, scale, gqa):
    return A.scaled_dot_product_attention(q, k, v, mask, 0.0, causal, scale=scale,
                                          enable_gqa=gqa)


def _efficient(q, k, v, mask, causal, scale, gqa):
    return A._scaled_dot_product_efficient_attention(q, k, v, mask, False, 0.0, causal,
                                                     scale=scale)[0]


def _cudnn(q, k, v, mask, causal, scale, gqa):
    return A._scaled_dot_product_cudnn_attention(q, k, v, mask, True, 0.0, causal, False,
                                                 scale=scale)[0]


def _flash(q, k, v, mask, causal, scale, gqa):
    return A._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, scale=scale)[0]


def _flash_cpu(q, k, v, mask, causal, scale, gqa):
    return A._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal,
                                                         attn_mask=mask, scale=scale)[0]


def _cuda_bias(mask, q, k):
    """torch's preprocess_mask for the efficient kernel: the mask expanded to [B, H, L, S],
    its rows padded to 16 and sliced back (a view with a row stride of 16)."""
    bias = mask.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    pad = -k.shape[2] % 16
    return F.pad(bias, (0, pad))[..., :k.shape[2]] if pad else bias


def _padded_efficient(q, k, v, mask, causal, scale, gqa):
    return _efficient(q, k, v, _cuda_bias(mask, q, k), causal, scale, gqa)


CASES = {   # op, mask ("float" [B, 1, L, S], "bool", None), is_causal, scale, K/V heads
    "sdpa": (_sdpa, None, False, None, 4),
    "sdpa float mask": (_sdpa, "float", False, None, 4),
    "sdpa bool mask": (_sdpa, "bool", False, 0.5, 4),
    "sdpa causal": (_sdpa, None, True, None, 4),
    "sdpa grouped queries": (_sdpa, "float", False, None, 2),
    "efficient": (_efficient, "float", False, 0.3, 4),
    "efficient causal and bias": (_efficient, "float", True, None, 4),
    "efficient as on cuda": (_padded_efficient, "float", False, None, 4),
    "flash causal": (_flash, None, True, None, 4),
    "cudnn": (_cudnn, "float", False, None, 4),
    "flash for cpu": (_flash_cpu, "float", False, None, 4),
    "flash for cpu causal": (_flash_cpu, None, True, 0.2, 4),
}


def _inputs(mask, heads, sq=5, sk=15, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 4, sq, 8, generator=gen)
    k, v = (torch.randn(2, heads, sk, 8, generator=gen) for _ in range(2))
    if mask == "bool":
        m = torch.rand(2, 1, sq, sk, generator=gen) > 0.3
        m[..., 0] = True   # no row without a key
    elif mask == "float":
        m = torch.randn(2, 1, sq, sk, generator=gen)
        m[..., 3] = -math.inf
    else:
        m = None
    return q, k, v, m


def _reference(q, k, v, m, causal, scale):
    """torch's scaled_dot_product_attention (its math on CPU), the causal mask added to a
    float mask where both are given."""
    if causal and m is not None:
        later = torch.ones(q.shape[-2], k.shape[-2]).triu(1).bool()
        m = m.masked_fill(later, -math.inf)
        causal = False
    if k.shape[1] != q.shape[1]:
        k, v = (x.repeat_interleave(q.shape[1] // x.shape[1], 1) for x in (k, v))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=causal, scale=scale)


def _traced(fn, inputs, causal, scale, gqa):
    q, k, v, m = inputs
    if m is None:
        return make_fx(lambda q, k, v: fn(q, k, v, None, causal, scale, gqa),
                       tracing_mode="fake")(q, k, v), [q, k, v]
    return make_fx(lambda q, k, v, m: fn(q, k, v, m, causal, scale, gqa),
                   tracing_mode="fake")(q, k, v, m), [q, k, v, m]


@pytest.mark.parametrize("case", sorted(CASES))
def test_attention_ops_import_as_torchs_math(case):
    fn, mask, causal, scale, heads = CASES[case]
    inputs = _inputs(mask, heads)
    gm, args = _traced(fn, inputs, causal, scale, heads != 4)
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert all(supported(n) for n in calls), [str(n.target) for n in calls]
    graph = import_fx(gm)
    (got,) = run_graph(graph, [a.numpy() for a in args])
    want = _reference(*inputs, causal, scale)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-6)
    # the chain fuse_attention fuses on cuda, meaning the same
    fused = optimize(import_fx(gm), CUDA_LIKE)
    assert [n.op for n in fused.nodes].count("FusedAttention") == 1, \
        [n.op for n in fused.nodes]
    (again,) = run_graph(fused, [a.numpy() for a in args])
    np.testing.assert_allclose(again, want.numpy(), rtol=1e-5, atol=1e-6)


def test_queries_after_the_keys_see_them_all_from_the_top_left():
    inputs = _inputs(None, 4, sq=6, sk=4)
    gm, args = _traced(_sdpa, inputs, True, None, False)
    (got,) = run_graph(import_fx(gm), [a.numpy() for a in args])
    want = _reference(*inputs, True, None)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-6)


def _attention_node(gm):
    return next(n for n in gm.graph.nodes if n.op == "call_function" and
                "scaled_dot_product" in str(n.target))


def test_dropout_and_a_read_logsumexp_stay_in_torch():
    q, k, v, m = _inputs("float", 4)
    dropped = make_fx(lambda q, k, v: A._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, 0.1)[0], tracing_mode="fake")(q, k, v)
    assert not supported(_attention_node(dropped))
    lse = make_fx(lambda q, k, v, m: A._scaled_dot_product_efficient_attention(
        q, k, v, m, True)[1], tracing_mode="fake")(q, k, v, _cuda_bias(m, q, k))
    node = _attention_node(lse)
    assert [u.args[1] for u in node.users if u.users] == [1]
    assert not supported(node)
    kept = make_fx(lambda q, k, v: A._scaled_dot_product_flash_attention(q, k, v)[0],
                   tracing_mode="fake")(q, k, v)
    assert supported(_attention_node(kept))   # its unread RNG state is uint64


def _efficient_as_on_cuda(q, k, v, dropout_p=0.0, is_causal=False, *, attn_mask=None,
                          scale=None):
    """What torch's CUDA dispatch of scaled_dot_product_attention hands a backend in fp32:
    the efficient kernel, its float bias padded (`_cuda_bias`)."""
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        attn_mask = torch.zeros(attn_mask.shape).masked_fill(~attn_mask, -math.inf)
    bias = None if attn_mask is None else _cuda_bias(attn_mask, q, k)
    _efficient_as_on_cuda.calls += 1
    out = A._scaled_dot_product_efficient_attention(q, k, v, bias, False, dropout_p,
                                                    is_causal, scale=scale)
    return out[0], out[1]


def test_static_cache_llama_with_the_cuda_attention_lowering(monkeypatch):
    """tests/compiler/test_torch_cuda.py's decoder on CPU, its attention lowered as on cuda
    (efficient attention, the mask padded to 16 keys and expanded): every attention op in
    dnnc, eager's greedy tokens, one compile each for the prefill and the decode step."""
    transformers = library("transformers", "LlamaConfig", "LlamaForCausalLM")
    config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64,
                                      intermediate_size=128, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=64,
                                      vocab_size=500, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(3, 500, (2, 8), generator=torch.Generator().manual_seed(1))
    options = {"max_new_tokens": 8, "do_sample": False, "cache_implementation": "static",
               "pad_token_id": 0, "eos_token_id": None}
    monkeypatch.setitem(torch_fx.DECOMPOSITIONS,
                        A._scaled_dot_product_flash_attention_for_cpu.default,
                        _efficient_as_on_cuda)
    _efficient_as_on_cuda.calls = 0
    with torch.no_grad():
        want = model.generate(ids, **options)
        torch._dynamo.reset()
        before = len(torch_backend.reports())
        model.forward = torch.compile(model.forward, backend=torch_backend.dnnc_backend)
        got = model.generate(ids, **options)
    torch._dynamo.reset()
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    prefill, decode = torch_backend.reports()[before:]
    assert _efficient_as_on_cuda.calls == 4   # 2 layers, 2 graphs
    # each graph one partition, its cache writes included: nothing left in torch
    assert all(r.partitions == 1 and not r.torch_ops for r in (prefill, decode))
    (segment,) = decode.models[0].runtime.compiled_segments()
    # every write computed in place: the caches, and the counters beside them (after
    # the kernels reading their old values)
    writes = decode.models[0].graph.aliases
    assert len(segment.in_place) == len(writes) >= 4 and decode.direct_call


def test_an_exported_program_keeps_scaled_dot_product_attention_whole():
    import dnnc

    class Attention(torch.nn.Module):
        def forward(self, q, k, v, m):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=m)

    q, k, v, m = _inputs("float", 4)
    program = torch.export.export(Attention(), (q, k, v, m))
    ops = [str(n.target) for n in program.run_decompositions(torch_fx.DECOMPOSITIONS)
           .graph.nodes if n.op == "call_function"]
    assert ops == ["aten.scaled_dot_product_attention.default"]
    got = dnnc.compile(program, "llvm", cache=False)(q, k, v, m)
    np.testing.assert_allclose(got, _reference(q, k, v, m, False, None).numpy(), rtol=1e-5,
                               atol=1e-6)


def test_a_causal_mask_over_symbolic_lengths():
    """dynamic=True: the lengths are symbols, the causal mask is computed from them, and one
    compile runs every length."""
    class Causal(torch.nn.Module):
        def forward(self, q, k, v):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    torch._dynamo.reset()
    before = len(torch_backend.reports())
    fn = torch.compile(Causal(), backend=torch_backend.dnnc_backend, dynamic=True)
    with torch.no_grad():
        for length in (5, 9):
            q, k, v, _ = _inputs(None, 4, sq=length, sk=length, seed=length)
            np.testing.assert_allclose(fn(q, k, v).numpy(),
                                       _reference(q, k, v, None, True, None).numpy(),
                                       rtol=1e-5, atol=1e-6)
    torch._dynamo.reset()
    (report,) = torch_backend.reports()[before:]
    assert report.partitions == 1 and not report.torch_ops, report
