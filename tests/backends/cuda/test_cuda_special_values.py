"""Special values on the GPU (`gpu` tier: skipped without one): float -> integer casts of NaN,
+-inf and huge values give docs/semantics.md's table (as on numpy and llvm:
tests/backends/test_float_to_int.py), and a batch of the fuzzer's special-values cases
(+-inf, NaN, +-1e30, +-FLT_MAX, +-0, subnormals in the inputs; softmax chains over such rows)
agrees with the numpy target and onnxruntime outside the documented differences.

    python -m pytest -n 0 -m gpu tests/backends/cuda/test_cuda_special_values.py
"""

import ml_dtypes
import numpy as np
import pytest

import dnnc
from dnnc.testing import fuzz
from dnnc.testing.special import CAST_PROBES, INT_TYPES, cast_model

SOURCES = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32,
           "float64": np.float64}


@pytest.mark.gpu
@pytest.mark.parametrize("source", sorted(SOURCES))
def test_float_to_int_casts_on_the_gpu_give_the_numpy_targets_table(source):
    with np.errstate(over="ignore"):
        x = np.array(CAST_PROBES, np.float64).astype(SOURCES[source])
    model = cast_model(source, len(x))
    want = dnnc.compile(model, target="numpy").run(x=x)
    for opt_level in (0, 3):
        got = dnnc.compile(model, target="cuda", opt_level=opt_level).run(x=x, to="numpy")
        for to, g, w in zip(INT_TYPES, got, want):
            bad = np.nonzero(g != w)[0]
            assert not bad.size, (f"{source} -> {to}, opt {opt_level}: (x, gpu, numpy) "
                                  f"{[(float(x[i]), g[i], w[i]) for i in bad[:8]]}")


@pytest.mark.gpu
@pytest.mark.parametrize("opt_level", [0, 3])
def test_special_values_fuzz_batch_on_the_gpu_finds_nothing(opt_level, tmp_path):
    args = fuzz.parse_args(["--special", "--cases", "60", "--seed", "41", "--target", "cuda",
                            "--opt-level", str(opt_level), "--out", str(tmp_path),
                            "--no-minimize", "--quiet"])
    summary = fuzz.fuzz(args)
    assert not fuzz.has_finding(summary), fuzz.summary_text(summary)
