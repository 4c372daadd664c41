#!/bin/bash
# bash bench/gpu_int8_ab.sh MAIN BRANCH (two dnnc trees; $OUT set: where results go): one
# device call, correctness on BRANCH (GPU int8 tests: those pytest's -k "$TESTS" picks,
# by default neither dense nor dynamic; the host-thread tests $HOST_TESTS on 4 workers, by
# default the int8 channels-last ones; each of the two within $TEST_SECONDS, 130 by default;
# the fuzzer's QDQ cases on cuda: seed $SEED, 55 by
# default) while the rows compile $MODEL (resnet50 b32 by default, or bert_base b8) in
# processes of their own ($ROWS, by default fp16 and int8 of MAIN, int8 and int8 on the
# 64 x 128 shallow tile of BRANCH; every row timed by BRANCH's bench/gpu_int8_ab.py with its
# own tree's dnnc), then time them in turn; under $OUT: tests.txt, host_tests.txt, fuzz.txt,
# rows.txt, each row's LABEL.json (at most 8 files come back from a device call)
set -u
M=$(realpath $1); B=$(realpath $2); SITE=${PYTHONPATH:-}; SEED=${SEED:-55}
export MODEL=${MODEL:-resnet50}
TESTS=${TESTS:-"not dense and not dynamic"}
HOST_TESTS=${HOST_TESTS:-tests/backends/cuda/test_cuda_int8_nhwc.py}
TEST_SECONDS=${TEST_SECONDS:-130}   # each of the two test runs' limit
ROWS=${ROWS:-"fp16:$M:fp16 int8:$M:main-int8 int8:$B:branch-int8 int8-64x128:$B:branch-64x128"}
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
T0=$(date +%s)
(cd $B && PYTHONPATH=$B:$SITE DNNC_CACHE_DIR=/tmp/cache_b timeout $TEST_SECONDS python3 -m pytest -o addopts="" -p no:xdist -q -rs tests/backends/cuda/test_cuda_int8_gpu.py -k "$TESTS" --durations=5 > $OUT/tests.txt 2>&1; echo "rc=$?" >> $OUT/tests.txt) &
P1=$!
(cd $B && PYTHONPATH=$B:$SITE timeout $TEST_SECONDS python3 -m pytest -o addopts="" -n 4 -q -rs $HOST_TESTS > $OUT/host_tests.txt 2>&1; echo "rc=$?" >> $OUT/host_tests.txt) &
P3=$!
(cd $B && PYTHONPATH=$B:$SITE DNNC_CACHE_DIR=/tmp/cache_f timeout 110 python3 -m dnnc.testing.fuzz --target cuda --boost qdq --cases 30 --seed $SEED --no-minimize --timeout 60 > $OUT/fuzz.txt 2>&1; echo "rc=$?" >> $OUT/fuzz.txt) &
P2=$!
(cd $B && PYTHONPATH=$B:$SITE python3 bench/gpu_int8_ab.py prep 2>&1 | grep --line-buffered -v Warn >> $OUT/rows.txt)
for r in $ROWS; do IFS=: read row tree name <<< "$r"
  (cd $tree && PYTHONPATH=$tree:$SITE DNNC_CACHE_DIR=/tmp/cache_$name python3 $B/bench/gpu_int8_ab.py $row $name 2>&1 | grep --line-buffered -v "Warn\|^dnnc: \[\|_warn_once" >> $OUT/rows.txt) &
done
wait $P1 $P2 $P3
echo "correctness done at $(( $(date +%s) - T0 ))s"
for r in $ROWS; do IFS=: read row tree name <<< "$r"
  for i in $(seq 400); do [ -e /tmp/fin/ready.$name ] && break; sleep 0.5; done
  touch /tmp/fin/go.$name
  for i in $(seq 120); do [ -e /tmp/fin/done.$name ] && break; sleep 0.5; done
done
echo "all done at $(( $(date +%s) - T0 ))s"
wait
tail -n 3 $OUT/tests.txt $OUT/host_tests.txt; tail -20 $OUT/fuzz.txt
cat $OUT/rows.txt
