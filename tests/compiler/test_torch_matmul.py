"""The flattened products torch's decomposition of `linear` and `matmul` leaves, imported as
N-D MatMuls (`frontend/torch_matmul.py`): FX graphs traced as aot_autograd traces them
(fake tensors, CompositeImplicit ops decomposed), their imported graphs against torch's
results, the nodes they import to, and the folds refused where they would not be exact.
Skips without torch."""

import collections

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402

from dnnc.backends.cuda import FUSION  # noqa: E402
from dnnc.frontend.torch_fx import DECOMPOSITIONS, import_fx  # noqa: E402
from dnnc.frontend.torch_matmul import fold  # noqa: E402
from dnnc.ir.interpreter import run_graph  # noqa: E402
from dnnc.ir.target import Target  # noqa: E402
from dnnc.passes.manager import optimize  # noqa: E402

CUDA_LIKE = Target("cuda", arch="sm_90", fusion=FUSION)


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _imported(fn, *args, mode="fake"):
    """`fn` traced to core ATen as aot_autograd traces it, its FX graph and dnnc graph, and
    the graph's results on `args` checked against torch's."""
    gm = make_fx(fn, DECOMPOSITIONS, tracing_mode=mode)(*args)
    graph = import_fx(gm)
    got = run_graph(graph, [a.numpy() for a in args])
    want = fn(*args)
    for g, w in zip(got, want if isinstance(want, tuple) else (want,)):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-5, atol=1e-5)
    return gm, graph


def _ops(graph) -> collections.Counter:
    return collections.Counter(n.op for n in graph.nodes)


@pytest.mark.parametrize("shape", [(2, 5, 8), (1, 3, 4, 8)])
def test_linear_on_nd_inputs_is_one_matmul_and_its_bias(shape):
    """view(addmm(b, view(x, [M, K]), Wᵀ), [..., N]) -> Add(MatMul(x, Wᵀ), b) on x itself:
    no Reshape left between the product and what reads it (convnext's Linear + GELU)."""
    x, w, b = _randn(*shape), _randn(6, 8, seed=1), _randn(6, seed=2)
    gm, graph = _imported(lambda x, w, b: F.gelu(F.linear(x, w, b)), x, w, b)
    assert [str(n.target) for n in gm.graph.nodes if "mm" in str(n.target)] == \
        ["aten.addmm.default"]   # what torch hands over
    ops = _ops(graph)
    assert ops["MatMul"] == 1 and ops["Add"] == 1 and ops["Reshape"] == 0, ops
    (matmul,) = [n for n in graph.nodes if n.op == "MatMul"]
    assert matmul.inputs[0] is graph.inputs[0]


def test_linear_without_bias_and_with_symbolic_batch():
    x, w = _randn(3, 7, 8), _randn(5, 8, seed=1)
    gm, graph = _imported(lambda x, w: F.linear(x, w), x, w, mode="symbolic")
    assert isinstance(graph.inputs[0].type.shape[0], str)   # symbolic dims compared too
    ops = _ops(graph)
    assert ops["MatMul"] == 1 and ops["Reshape"] == 0, ops


def _attention(q, k, v):
    """Attention as transformers' eager attention writes it (bert, gpt2)."""
    return torch.matmul(torch.softmax(torch.matmul(q, k.transpose(-1, -2)) * 0.3, -1), v)


def test_batched_matmuls_are_n_d_and_attention_fuses_on_cuda():
    """bmm of expanded, flattened [B, H, L, D] operands -> MatMul on the 4-D ones: the chain
    fuse_attention matches (one FusedAttention, as the ONNX export of the model gives)."""
    q, k, v = (_randn(2, 3, 5, 8, seed=s) for s in range(3))
    gm, graph = _imported(_attention, q, k, v)
    assert sum(str(n.target) == "aten.bmm.default" for n in gm.graph.nodes) == 2
    ops = _ops(graph)
    assert ops["MatMul"] == 2 and ops["Expand"] == 0 and ops["Reshape"] == 0, ops
    fused = optimize(import_fx(gm), CUDA_LIKE)
    assert _ops(fused)["FusedAttention"] == 1, _ops(fused)
    (again,) = run_graph(fused, [q.numpy(), k.numpy(), v.numpy()])
    np.testing.assert_allclose(again, _attention(q, k, v).numpy(), rtol=1e-5, atol=1e-6)


def test_broadcast_batch_dims_fold_and_their_results_match():
    """[B, 1, L, D] @ [B, H, D, S] (torch expands the first): MatMul's broadcast is torch's."""
    a, b = _randn(2, 1, 5, 8), _randn(2, 3, 8, 4, seed=1)
    gm, graph = _imported(torch.matmul, a, b)
    assert len(fold(gm)) == 1 and _ops(graph)["MatMul"] == 1


def test_views_that_do_not_restore_the_batch_dims_are_imported_as_they_are():
    """view(mm(view(x, [6, 4]), W), [3, 2, 5]) regroups the rows: no fold, same result."""
    def regroup(x, w):
        return torch.mm(x.reshape(6, 4), w).reshape(3, 2, 5)

    gm, graph = _imported(regroup, _randn(2, 3, 4), _randn(4, 5, seed=1))
    assert fold(gm) == {} and _ops(graph)["Reshape"] >= 2


def test_a_flattened_operand_something_else_reads_is_still_imported():
    """The 2-D view feeds the product and an output: it stays, the product folds."""
    def both(x, w):
        flat = x.reshape(-1, 8)
        return (flat @ w).reshape(2, 5, 6), flat * 2

    gm, graph = _imported(both, _randn(2, 5, 8), _randn(8, 6, seed=1))
    (found,) = fold(gm).values()
    assert not any(str(n.target).startswith("aten.view") for n in found.skipped)
    assert _ops(graph)["MatMul"] == 1
