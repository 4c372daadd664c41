"""The half-precision accuracy contract on a GPU (issue 31, item 4; `gpu` marker: skipped
without one): every zoo model compiled for cuda at fp16 and at bf16 (weights and activations
stored in that type, products on tensor cores) against the fp32 reference (the numpy target)
on the same random inputs:

- every output within `model_error_bound(precision)` (16 u of its largest magnitude;
  docs/cuda_backend.md, "Precision");
- the classifiers, on a batch of 64 random inputs: the same top-1 class wherever the
  reference's two largest logits are more than twice the bound apart (the bound makes that
  certain), and in at least TOP1_ROWS of the 64 rows overall: the zoo's random weights leave
  the top two logits of many rows closer than a bf16 unit, where the rounding decides (on
  the NumPy interpreter of the stored graph: fp16 62 to 64 rows, bf16 58 to 64).

    python -m pytest -m gpu tests/backends/cuda/test_cuda_half_gpu.py
"""

import functools

import numpy as np
import pytest

import dnnc
from dnnc import zoo
from dnnc.ir.target import model_error_bound

pytestmark = pytest.mark.gpu

MODELS = {
    "mlp": {"batch": 64}, "cnn": {"batch": 64},
    "resnet18": {"batch": 64, "size": 64}, "resnet50": {"batch": 64, "size": 64},
    "mobilenet_v2": {"batch": 64, "size": 64},
    "bert": {"batch": 8}, "bert_tiny": {"batch": 8}, "bert_base": {"batch": 8},
}
"""Zoo model -> its build options: the classifiers at batch 64 (images of 64 pixels, so that
the reference's time stays seconds), the encoders at batch 8 and sequence 128."""
CLASSIFIERS = ("mlp", "cnn", "resnet18", "resnet50", "mobilenet_v2")
TOP1_ROWS = {"fp16": 60, "bf16": 56}
"""Rows of 64 whose top-1 class must agree with the reference's (15/16 and 7/8)."""


@functools.lru_cache(maxsize=None)
def _reference(name: str):
    """(model, inputs, the numpy target's float32 outputs) of zoo model `name`."""
    model = zoo.build(name, **MODELS[name])
    inputs = list(zoo.inputs_for(model, np.random.default_rng(64)).values())
    outputs = dnnc.compile(model, "numpy")(*inputs)
    return model, inputs, [np.asarray(o) for o in _listed(outputs)]


def _listed(outputs) -> list:
    return list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("name", MODELS)
def test_zoo_model_at_half_precision_within_the_bound(name, precision):
    model, inputs, want = _reference(name)
    compiled = dnnc.compile(model, "cuda", precision=precision, outputs="numpy")
    got = _listed(compiled(*inputs))
    bound = model_error_bound(precision)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == np.float32 and g.shape == w.shape
        scale = np.abs(w.astype(np.float64)).max()
        error = np.abs(g.astype(np.float64) - w).max() / scale
        assert error <= bound, f"{name} at {precision}: {error:.3g} > {bound:.3g}"
    if name in CLASSIFIERS:
        (g,), (w,) = got, want
        top2 = np.sort(w, axis=-1)[:, -2:]
        decided = top2[:, 1] - top2[:, 0] > 2 * bound * np.abs(w).max()
        agree = np.argmax(g, axis=-1) == np.argmax(w, axis=-1)
        assert agree[decided].all(), f"{name} at {precision}: top-1 differs in rows " \
            f"{np.flatnonzero(decided & ~agree)[:8]} of {decided.sum()} decided"
        assert len(w) == 64 and agree.sum() >= TOP1_ROWS[precision], \
            f"{name} at {precision}: top-1 agrees in {agree.sum()} of 64 rows"
