#!/bin/bash
# bash bench/gpu_int8_ab.sh (from the repository root, $OUT set: where results go)
# one device call: correctness (GPU int8 tests, the fuzzer's QDQ cases on cuda) while three
# processes compile resnet50 b32 (fp16, int8 before, int8 after, a variant), then time in turn
set -u
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
T0=$(date +%s)
python3 bench/gpu_int8_ab.py prep 2>&1 | grep -v Warn
(timeout 90 python3 -m pytest -o addopts="" -p no:xdist -q -rs tests/backends/cuda/test_cuda_int8_gpu.py -k "not dense and not dynamic" --durations=5 > $OUT/tests.txt 2>&1; echo "rc=$?" >> $OUT/tests.txt) &
P1=$!
(timeout 90 python3 -m dnnc.testing.fuzz --target cuda --boost qdq --cases 30 --seed 46 --no-minimize --timeout 60 > $OUT/fuzz.txt 2>$OUT/fuzz.err; echo "rc=$?" >> $OUT/fuzz.txt) &
P2=$!
python3 bench/gpu_int8_ab.py fp16 > $OUT/fp16.txt 2>&1 &
DNNC_SPACE_TO_DEPTH=0 python3 bench/gpu_int8_ab.py before > $OUT/before.txt 2>&1 &
python3 bench/gpu_int8_ab.py after > $OUT/after.txt 2>&1 &
python3 bench/gpu_int8_ab.py after-64x128 > $OUT/after-64x128.txt 2>&1 &
wait $P1 $P2
echo "correctness done at $(( $(date +%s) - T0 ))s"
for n in fp16 before after after-64x128; do
  for i in $(seq 200); do [ -e /tmp/fin/ready.$n ] && break; sleep 0.5; done
  touch /tmp/fin/go.$n
  for i in $(seq 120); do [ -e /tmp/fin/done.$n ] && break; sleep 0.5; done
done
echo "all done at $(( $(date +%s) - T0 ))s"
wait
tail -5 $OUT/tests.txt; tail -20 $OUT/fuzz.txt; cat $OUT/fp16.txt $OUT/before.txt $OUT/after.txt $OUT/after-64x128.txt | grep -v Warn | grep -v "^dnnc: \[\|_warn_once"
