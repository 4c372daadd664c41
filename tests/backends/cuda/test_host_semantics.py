"""The CUDA C the renderer writes means what the IR means: every op on every dtype (the
kernels of test_codegen's `_every_op`) rendered by the cuda renderer, compiled as host C++
by g++ with a small shim for CUDA's built-ins (each kernel's threads run one after another),
against the same PrimFuncs rendered by the llvm backend (the IR's tested meaning), on random
inputs. This checks the op tables, literals, casts, bit casts and the float16 conversions'
rounding without a GPU; the GPU's own math library is gpu_check.py's to check."""

import ctypes
import shutil
import subprocess

import ml_dtypes
import numpy as np
import pytest

from dnnc.backends.cuda.codegen import PRELUDE, c_name, render_module
from dnnc.ir import loop as L
from dnnc.ir import types as T
from test_codegen import _every_op, run_on_cpu

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not on PATH")

SHIM = r"""
#include <cmath>
#include <cstring>
struct dnnc_dim3 { unsigned x = 0, y = 0, z = 0; };
static dnnc_dim3 threadIdx, blockIdx;
extern "C" void dnnc_set_thread(unsigned x) { threadIdx.x = x; }
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __shared__ static
#define __restrict__ __restrict
template <typename To, typename From> static inline To dnnc_bits(From x) {
  To y; std::memcpy(&y, &x, sizeof y); return y;
}
static inline float __uint_as_float(unsigned x) { return dnnc_bits<float>(x); }
static inline float __int_as_float(int x) { return dnnc_bits<float>(x); }
static inline unsigned __float_as_uint(float x) { return dnnc_bits<unsigned>(x); }
static inline int __float_as_int(float x) { return dnnc_bits<int>(x); }
static inline long long __double_as_longlong(double x) { return dnnc_bits<long long>(x); }
static inline double __longlong_as_double(long long x) { return dnnc_bits<double>(x); }
// the PTX conversions of the prelude, as the host rounds them (to nearest even)
static inline float dnnc_h2f(unsigned short h) { return (float)dnnc_bits<_Float16>(h); }
static inline unsigned short dnnc_f2h(float f) { return dnnc_bits<unsigned short>((_Float16)f); }
"""


def host_library(funcs, tmp_path) -> ctypes.CDLL:
    source = render_module([(f, True) for f in funcs]).source
    assert source.startswith(PRELUDE)
    device_only = PRELUDE[PRELUDE.index("// NaN-propagating"):]   # the templates stay
    path = tmp_path / "kernels.cc"
    path.write_text(SHIM + device_only + source[len(PRELUDE):])
    lib = tmp_path / "kernels.so"
    # -fwrapv: signed overflow wraps, as the IR says (CUDA C leaves it undefined; nvcc does
    # not exploit it in these kernels)
    proc = subprocess.run(["g++", "-std=c++17", "-O1", "-fwrapv", "-shared", "-fPIC", "-w",
                           "-o", str(lib), str(path)], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return ctypes.CDLL(str(lib))


def _random(rng, dtype: T.DType, n: int) -> np.ndarray:
    if dtype.kind == "b":
        return rng.random(n) < 0.5
    if dtype.is_int:
        info = np.iinfo(dtype.np)
        return rng.integers(info.min, info.max, n, dtype=dtype.np, endpoint=True)
    x = rng.standard_normal(n) * 10.0 ** rng.integers(-2, 3, n)
    x[:3] = (np.inf, -np.inf, np.nan)[: n]
    return x.astype(dtype.np)


def _inputs(rng, func: L.PrimFunc) -> list[np.ndarray]:
    """Inputs on which C and the IR agree: shift amounts below the width, float -> int
    casts within range."""
    name = func.name.split("_", 1)[1]
    out = []
    for b in func.params[:-1]:
        n = b.shape[0].value
        x = _random(rng, b.dtype, n)
        if name.endswith(("_<<", "_>>")) and b is func.params[1]:
            x = (rng.integers(0, 8 * b.dtype.itemsize, n)).astype(b.dtype.np)
        dst = func.params[-1].dtype
        if "_to_" in name and b.dtype.is_float and dst.is_int:
            info = np.iinfo(dst.np)
            lo, hi = max(float(info.min), -3e4), min(float(info.max), 3e4)
            x = rng.uniform(lo, hi, n).astype(b.dtype.np)
        out.append(x)
    return out


def test_every_op_means_what_the_ir_means(rng, tmp_path):
    funcs = _every_op()
    lib = host_library(funcs, tmp_path)
    inputs = {f.name: _inputs(rng, f) for f in funcs}
    cuda, llvm = {}, {}
    for f in funcs:
        y = f.params[-1]
        cuda[f.name] = inputs[f.name] + [np.zeros(y.shape[0].value, y.dtype.np)]
        llvm[f.name] = [x.copy() for x in inputs[f.name]] + [np.zeros_like(cuda[f.name][-1])]
    run_on_cpu(funcs, llvm)
    failures = []
    for f in funcs:
        args = [a.ctypes.data for a in cuda[f.name]]
        fn = getattr(lib, c_name(f.name))
        fn.restype = None
        for t in range(f.params[-1].shape[0].value):
            lib.dnnc_set_thread(t)
            fn(*[ctypes.c_void_p(a) for a in args])
        got, want = cuda[f.name][-1], llvm[f.name][-1]
        if got.dtype.kind == "f" or got.dtype == ml_dtypes.bfloat16:
            g, w = got.astype(np.float64), want.astype(np.float64)
            bad = ~((g == w) | (np.isnan(g) & np.isnan(w)))
        else:
            bad = got != want
        if bad.any():
            failures.append(f"{f.name}: {got[bad][:3]} != {want[bad][:3]} "
                            f"(inputs {[x[bad][:3] for x in inputs[f.name]]})")
    assert not failures, "\n".join(failures[:40])
