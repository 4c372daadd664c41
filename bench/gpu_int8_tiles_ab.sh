#!/bin/bash
# bash bench/gpu_int8_tiles_ab.sh MAIN BRANCH (two dnnc trees; $OUT set): one device call
# for a change of int8.choose: BRANCH's GPU int8 tests (within $TEST_SECONDS) and the
# fuzzer's QDQ cases on cuda (seed $SEED) while the rows compile (bench/gpu_int8_ab.py:
# bert_base b8 fp16 of MAIN and int8 of MAIN and BRANCH, resnet50 b32 int8 of MAIN and
# BRANCH) and bench/gpu_int8_tiles.py's kernels of resnet50's products in $ONLY; then those
# kernels timed alone, then the rows in turn. Under $OUT: checks.txt, rows.txt,
# int8_tiles.json, each row's LABEL.json.
set -u
M=$(realpath $1); B=$(realpath $2); SITE=${PYTHONPATH:-}; SEED=${SEED:-59}
TEST_SECONDS=${TEST_SECONDS:-120}
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
T0=$(date +%s)
for model in bert_base resnet50; do
  (cd $B && MODEL=$model FIN=/tmp/fin_$model PYTHONPATH=$B:$SITE python3 bench/gpu_int8_ab.py prep 2>&1 | grep -v Warn >> $OUT/rows.txt) &
done
wait
(cd $B && PYTHONPATH=$B:$SITE DNNC_CACHE_DIR=/tmp/cache_t timeout $TEST_SECONDS python3 -m pytest -o addopts="" -p no:xdist -q -rs tests/backends/cuda/test_cuda_int8_gpu.py --durations=3 > $OUT/tests.txt 2>&1; echo "rc=$?" >> $OUT/tests.txt) &
P1=$!
(cd $B && PYTHONPATH=$B:$SITE DNNC_CACHE_DIR=/tmp/cache_f timeout $TEST_SECONDS python3 -m dnnc.testing.fuzz --target cuda --boost qdq --cases ${CASES:-30} --seed $SEED --no-minimize --timeout 60 > $OUT/fuzz.txt 2>&1; echo "rc=$?" >> $OUT/fuzz.txt) &
P2=$!
(cd $B && PYTHONPATH=$B:$SITE DNNC_CACHE_DIR=/tmp/cache_s GATE=/tmp/gate python3 bench/gpu_int8_tiles.py $(cat /tmp/fin_resnet50/path) 2>&1 | grep --line-buffered -v Warn > /tmp/tiles.txt) &
P3=$!
row() {   # MODEL ROW TREE LABEL: compile in the background, wait for its turn
  (cd $3 && MODEL=$1 FIN=/tmp/fin_$1 PYTHONPATH=$3:$SITE DNNC_CACHE_DIR=/tmp/cache_$4 python3 $B/bench/gpu_int8_ab.py $2 $4 2>&1 | grep --line-buffered -v "Warn\|^dnnc: \[\|_warn_once" >> $OUT/rows.txt) &
}
turn() {   # MODEL LABEL
  for i in $(seq 400); do [ -e /tmp/fin_$1/ready.$2 ] && break; sleep 0.5; done
  touch /tmp/fin_$1/go.$2
  for i in $(seq 120); do [ -e /tmp/fin_$1/done.$2 ] && break; sleep 0.5; done
}
row bert_base fp16 $M bert-fp16; row bert_base int8 $M bert-main; row bert_base int8 $B bert-branch
row resnet50 int8 $M r50-main; row resnet50 int8 $B r50-branch
wait $P1 $P2
echo "correctness done at $(( $(date +%s) - T0 ))s"
cat $OUT/tests.txt $OUT/fuzz.txt > $OUT/checks.txt; rm $OUT/tests.txt $OUT/fuzz.txt
touch /tmp/gate
wait $P3
echo "sweep done at $(( $(date +%s) - T0 ))s"
turn bert_base bert-fp16; turn bert_base bert-main; turn bert_base bert-branch
turn resnet50 r50-main; turn resnet50 r50-branch
echo "all done at $(( $(date +%s) - T0 ))s"
wait
tail -n 4 $OUT/checks.txt
cat /tmp/tiles.txt $OUT/rows.txt
