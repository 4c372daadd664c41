"""CUDA tensors through the torch.compile backend and the torch.export path: read in place by
the cuda target on torch's current stream, outputs CUDA tensors (DLPack), checked against
eager. A device tier: skips without torch, without a CUDA GPU torch sees, or without the
cuda target (CuPy)."""

import numpy as np
import pytest

import dnnc
from dnnc.backends.registry import REGISTRY

torch = pytest.importorskip("torch")
if not torch.cuda.is_available() or not REGISTRY["cuda"].available():
    pytest.skip("needs a CUDA GPU that torch and CuPy both see", allow_module_level=True)

from dnnc.compiler import torch_backend  # noqa: E402
from torch_modules import Block, ResNetLike, randomize_batch_norm  # noqa: E402

CUDA = torch.device("cuda")


@pytest.fixture(autouse=True)
def fp32_reference():
    """Eager in fp32 arithmetic: cuDNN's convolutions default to TF32."""
    conv, matmul = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = conv, matmul


def close(got, want, tol=1e-3):
    assert got.device == want.device
    np.testing.assert_allclose(got.cpu().numpy(), want.cpu().numpy(), rtol=tol, atol=tol)


def compiled(module):
    torch._dynamo.reset()
    return torch.compile(module, backend=torch_backend.dnnc_backend)


@pytest.mark.parametrize("build, shape", [(ResNetLike, (2, 3, 32, 32)), (Block, (2, 7, 32))])
def test_backend_runs_cuda_tensors_on_the_cuda_target(build, shape):
    torch.manual_seed(0)
    module = randomize_batch_norm(build()).eval().to(CUDA)
    x = torch.randn(*shape, device=CUDA)
    before = len(torch_backend.reports())
    fn = compiled(module)
    with torch.no_grad():
        for _ in range(3):   # the third call reads the input in place (a captured graph)
            got = fn(x)
        close(got, module(x))
    (report,) = torch_backend.reports()[before:]
    assert report.partitions >= 1 and sum(report.torch_ops.values()) == 0, report
    assert {m.target for m in report.models} == {"cuda"}
    assert got.is_cuda and isinstance(got, torch.Tensor)


def test_backend_runs_on_the_callers_stream():
    """A side stream is busy, then writes the input: a call on any other stream would read
    the input before it is written."""
    torch.manual_seed(0)
    module = ResNetLike().eval().to(CUDA)
    fn = compiled(module)
    x = torch.randn(2, 3, 32, 32, device=CUDA)
    with torch.no_grad():
        fn(x)
        want = module(x)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                buffer = torch.zeros_like(x)
                torch.cuda._sleep(50_000_000)   # ~25 ms of spinning before the write
                buffer.copy_(x)
                got = fn(buffer)
        side.synchronize()
    close(got, want)


def test_exported_program_takes_cuda_tensors_in_place():
    torch.manual_seed(0)
    module = randomize_batch_norm(ResNetLike()).eval().to(CUDA)
    batch = torch.export.Dim("batch", max=16)
    x = torch.randn(2, 3, 32, 32, device=CUDA)
    program = torch.export.export(module, (x,), dynamic_shapes=({0: batch},))
    model = dnnc.compile(program, "cuda", cache=False)
    with torch.no_grad():
        for size in (2, 5):
            x = torch.randn(size, 3, 32, 32, device=CUDA)
            side = torch.cuda.Stream()
            with torch.cuda.stream(side):
                buffer = torch.zeros_like(x)
                torch.cuda._sleep(50_000_000)
                buffer.copy_(x)
                got = torch.from_dlpack(model(buffer))   # CuPy out, a CUDA tensor over it
            side.synchronize()
            close(got, module(x))


def test_static_cache_generate_on_cuda_compiles_prefill_and_decode_once():
    """On cuda, aot_autograd lowers the attention to _scaled_dot_product_efficient_attention
    with its mask padded to 16 keys and expanded: imported as the attention chain (the same
    graph on CPU: test_torch_attention.py's llama test), nothing of it stays in torch; the
    cache writes are dnnc's too, computed in the cache tensors (each graph one partition),
    which hold eager's keys and values at the end."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                                      num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=64, vocab_size=500,
                                      bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval().to(CUDA)
    # generate's own torch.compile (inductor, reduce-overhead, on cuda with a static cache)
    # off: eager's tokens from eager, and the backend's compiles the only ones
    model.generation_config.disable_compile = True
    ids = torch.randint(3, 500, (2, 8), generator=torch.Generator().manual_seed(1)).to(CUDA)
    options = {"max_new_tokens": 8, "do_sample": False, "pad_token_id": 0,
               "eos_token_id": None}
    caches = [transformers.StaticCache(config=config, max_cache_len=16) for _ in range(2)]
    with torch.no_grad():
        want = model.generate(ids, past_key_values=caches[0], **options)
        torch._dynamo.reset()
        before = len(torch_backend.reports())
        model.forward = torch.compile(model.forward, backend=torch_backend.dnnc_backend)
        got = model.generate(ids, past_key_values=caches[1], **options)
    assert torch.equal(got, want)
    for eager, ours in zip(*(c.layers for c in caches)):
        close(ours.keys, eager.keys)
        close(ours.values, eager.values)
    reports = torch_backend.reports()[before:]
    assert len(reports) == 2 and all({m.target for m in r.models} == {"cuda"} for r in reports)
    prefill, decode = reports   # (the prefill leaves device copies, _to_copy, to torch)
    assert prefill.partitions == decode.partitions == 1 and not decode.torch_ops, \
        [r.torch_ops for r in reports]
    (segment,) = decode.models[0].runtime.compiled_segments()
    # every write computed in place: the caches, and the counters beside them (after
    # the kernels reading their old values)
    assert len(segment.in_place) == len(decode.models[0].graph.aliases) >= 4


def test_a_cache_write_on_cuda_writes_the_cache_tensor_in_place():
    """The cache's new value computed in the cache tensor itself each step (from the third
    call on the captured CUDA graph reads and writes it there; before, the frame's buffer is
    copied back; a cache above the runtime's COPIED_INPUT_BYTES), the tensor as eager's after
    every step."""
    from test_torch_backend import Cache   # (its folder is on the path, as torch_modules')

    torch.manual_seed(0)
    model, twin = Cache(False, 128).eval().to(CUDA), Cache(False, 128).eval().to(CUDA)
    twin.load_state_dict(model.state_dict())
    fn = compiled(twin)
    cache = twin.cache
    with torch.no_grad():
        for step in range(5):
            x, pos = torch.randn(2, 1, 4, device=CUDA), torch.tensor([step], device=CUDA)
            close(fn(x, pos), model(x, pos))
            close(twin.cache, model.cache, 1e-6)
    assert twin.cache is cache
    report = torch_backend.reports()[-1]
    assert report.partitions == 1 and not report.torch_ops, report.torch_ops
    (segment,) = report.models[0].runtime.compiled_segments()
    assert len(segment.in_place) == 1


def test_a_cuda_model_returns_torch_tensors_of_its_own():
    """to="torch": CUDA tensors the runtime filled on torch's stream, each the caller's (the
    next call leaves it), in the output's dtype (bfloat16 as torch.bfloat16)."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"]),
         helper.make_node("Cast", ["y"], ["h"], to=TensorProto.BFLOAT16)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 33])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 33]),
         helper.make_tensor_value_info("h", TensorProto.BFLOAT16, [4, 33])])
    model = dnnc.compile(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
                         "cuda", cache=False)
    x, x2 = torch.randn(4, 33, device=CUDA), torch.randn(4, 33, device=CUDA)
    y, h = model(x, to="torch")
    y2, _ = model(x2, to="torch")
    assert isinstance(y, torch.Tensor) and y.is_cuda and y.dtype == torch.float32
    assert h.dtype == torch.bfloat16 and h.is_cuda
    close(y, torch.relu(x), 0)
    close(y2, torch.relu(x2), 0)
    close(h.float(), torch.relu(x).bfloat16().float(), 0)
    assert y.data_ptr() != y2.data_ptr()
