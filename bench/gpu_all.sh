#!/bin/sh
# Every GPU test and benchmark of the cuda target, in one command, on a machine with CuPy and a
# CUDA GPU (the tests skip and the benchmark stops with one line where there is none):
#     sh bench/gpu_all.sh [bench/gpu.py options, e.g. --models mlp,cnn]
# The tests run first (a wrong model makes its latency meaningless); the benchmarks (the
# kernels against cuBLAS, copy bandwidth and torch, the zoo's latency, then what each way of
# calling costs) run either way, and the exit status is non-zero if any failed.
cd "$(dirname "$0")/.." || exit 2
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
python -m pytest -q -rs -m "gpu or codegen" tests/backends/cuda
tests=$?
python bench/gpu_kernels.py
kernels=$?
python bench/gpu.py --big --cold "$@"
bench=$?
python bench/cuda_calls.py
calls=$?
[ "$tests" -eq 0 ] && [ "$kernels" -eq 0 ] && [ "$bench" -eq 0 ] && [ "$calls" -eq 0 ]
