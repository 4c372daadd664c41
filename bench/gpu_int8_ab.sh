#!/bin/bash
# bash bench/gpu_int8_ab.sh MAIN BRANCH (two dnnc trees, each holding this bench/; $OUT set:
# where results go): one device call, correctness on BRANCH (GPU int8 tests, the fuzzer's QDQ
# cases on cuda) while four processes compile resnet50 b32 (fp16 and int8 of MAIN, int8 and
# int8 on the 64 x 128 shallow tile of BRANCH), then time in turn
set -u
M=$(realpath $1); B=$(realpath $2); SITE=${PYTHONPATH:-}
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
T0=$(date +%s)
(cd $B && PYTHONPATH=$B:$SITE python3 bench/gpu_int8_ab.py prep 2>&1 | grep -v Warn)
(cd $B && PYTHONPATH=$B:$SITE DNNC_CACHE_DIR=/tmp/cache_b timeout 120 python3 -m pytest -o addopts="" -p no:xdist -q -rs tests/backends/cuda/test_cuda_int8_gpu.py -k "not dense and not dynamic" --durations=5 > $OUT/tests.txt 2>&1; echo "rc=$?" >> $OUT/tests.txt) &
P1=$!
(cd $B && PYTHONPATH=$B:$SITE DNNC_CACHE_DIR=/tmp/cache_f timeout 120 python3 -m dnnc.testing.fuzz --target cuda --boost qdq --cases 30 --seed 55 --no-minimize --timeout 60 > $OUT/fuzz.txt 2>$OUT/fuzz.err; echo "rc=$?" >> $OUT/fuzz.txt) &
P2=$!
ROWS="fp16:$M:fp16 int8:$M:main-int8 int8:$B:branch-int8 int8-64x128:$B:branch-64x128"
for r in $ROWS; do IFS=: read row tree name <<< "$r"
  (cd $tree && PYTHONPATH=$tree:$SITE DNNC_CACHE_DIR=/tmp/cache_$name python3 bench/gpu_int8_ab.py $row $name > $OUT/$name.txt 2>&1) &
done
wait $P1 $P2
echo "correctness done at $(( $(date +%s) - T0 ))s"
for r in $ROWS; do IFS=: read row tree name <<< "$r"
  for i in $(seq 400); do [ -e /tmp/fin/ready.$name ] && break; sleep 0.5; done
  touch /tmp/fin/go.$name
  for i in $(seq 120); do [ -e /tmp/fin/done.$name ] && break; sleep 0.5; done
done
echo "all done at $(( $(date +%s) - T0 ))s"
wait
tail -5 $OUT/tests.txt; tail -20 $OUT/fuzz.txt
for r in $ROWS; do IFS=: read row tree name <<< "$r"; grep -v "Warn\|^dnnc: \[\|_warn_once" $OUT/$name.txt; done
