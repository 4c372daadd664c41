#!/bin/bash
# bash bench/gpu_int8_tiles.sh MAIN BRANCH (two dnnc trees; $OUT set): one device call on
# bert_base b8 (dynamically quantized, as bench/gpu_int8_ab.py makes it): BRANCH's GPU int8
# tests (-k "$TESTS", within $TEST_SECONDS) and the fuzzer's QDQ cases on cuda (seed $SEED)
# while the tile sweep (bench/gpu_int8_tiles.py) and the rows fp16 and int8 of MAIN compile;
# then the sweep's kernels timed alone, then the rows in turn, `int8-tiles` (each
# product on the sweep's fastest tile, BRANCH's bench) last. Under $OUT: tests.txt,
# fuzz.txt, tiles.txt, int8_tiles.json, rows.txt, each row's LABEL.json.
set -u
M=$(realpath $1); B=$(realpath $2); SITE=${PYTHONPATH:-}; SEED=${SEED:-58}
export MODEL=bert_base
TESTS=${TESTS:-"dense or dynamic"}
TEST_SECONDS=${TEST_SECONDS:-100}
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
T0=$(date +%s)
(cd $B && PYTHONPATH=$B:$SITE python3 bench/gpu_int8_ab.py prep 2>&1 | grep -v Warn >> $OUT/rows.txt)
(cd $B && PYTHONPATH=$B:$SITE DNNC_CACHE_DIR=/tmp/cache_t timeout $TEST_SECONDS python3 -m pytest -o addopts="" -p no:xdist -q -rs tests/backends/cuda/test_cuda_int8_gpu.py -k "$TESTS" --durations=3 > $OUT/tests.txt 2>&1; echo "rc=$?" >> $OUT/tests.txt) &
P1=$!
(cd $B && PYTHONPATH=$B:$SITE DNNC_CACHE_DIR=/tmp/cache_f timeout $TEST_SECONDS python3 -m dnnc.testing.fuzz --target cuda --boost qdq --cases 30 --seed $SEED --no-minimize --timeout 60 > $OUT/fuzz.txt 2>&1; echo "rc=$?" >> $OUT/fuzz.txt) &
P2=$!
(cd $B && PYTHONPATH=$B:$SITE DNNC_CACHE_DIR=/tmp/cache_s GATE=/tmp/fin/gate python3 bench/gpu_int8_tiles.py $(cat /tmp/fin/path) /tmp/fin/float.onnx 2>&1 | grep --line-buffered -v Warn > $OUT/tiles.txt) &
P3=$!
row() {   # ROW TREE LABEL: compile in the background, wait for its turn
  (cd $2 && PYTHONPATH=$2:$SITE DNNC_CACHE_DIR=/tmp/cache_$3 python3 $B/bench/gpu_int8_ab.py $1 $3 2>&1 | grep --line-buffered -v "Warn\|^dnnc: \[\|_warn_once" >> $OUT/rows.txt) &
}
turn() {
  for i in $(seq 400); do [ -e /tmp/fin/ready.$1 ] && break; sleep 0.5; done
  touch /tmp/fin/go.$1
  for i in $(seq 120); do [ -e /tmp/fin/done.$1 ] && break; sleep 0.5; done
}
row fp16 $M fp16; row int8 $M main-int8
wait $P1 $P2
echo "correctness done at $(( $(date +%s) - T0 ))s"
touch /tmp/fin/gate
wait $P3
echo "sweep done at $(( $(date +%s) - T0 ))s"
row int8-tiles $B sweep-tiles
turn fp16; turn main-int8; turn sweep-tiles
echo "all done at $(( $(date +%s) - T0 ))s"
wait
tail -n 3 $OUT/tests.txt; tail -5 $OUT/fuzz.txt
cat $OUT/tiles.txt $OUT/rows.txt
