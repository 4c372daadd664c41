#!/bin/sh
# bench/cpu.py's tables in one or two commands on a machine of 16 cores or more (the GPU
# machine's host), each runtime on the same cores:
#     sh bench/cpu_all.sh OUT_DIR pairs    2-thread tables: alone, alternating, beside a busy
#                                          process (two shards), and 1 thread alone; each run
#                                          confined to its own cores, all at the same time
#     sh bench/cpu_all.sh OUT_DIR many     the same models alone with 16 threads
# Runs on disjoint cores still share the L3 and memory bandwidth: the 2-core machine's own
# figures come from bench/cpu.py run there. Model sets: bench/cpu.py's docstring; MODELS=...
# picks others, LIMIT=seconds stops each run (its table so far is kept).
cd "$(dirname "$0")/.." || exit 2
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
out=${1:?OUT_DIR}
part=${2:-pairs}
models=${MODELS:-zoo,torch,library,library-dynamo,light}
mkdir -p "$out"
# exported once, before the runs that read them (concurrent runs would race to write them)
python -c "import sys; sys.path.insert(0, 'bench'); import cpu; cpu.expand_models('$models')" \
    > "$out/exports.txt" 2>&1
run() {   # cores, file, options
    cores=$1 file=$2
    shift 2
    timeout "${LIMIT:-86400}" taskset -c "$cores" python bench/cpu.py --models "$models" "$@" > "$out/$file" 2>&1
}
case $part in
pairs)
    run 0,1 alone2.txt --threads 2 &
    run 2,3 alternate.txt --threads 2 --load alternate --blocks 3 --repeat 10 &
    run 4,5 busy1.txt --threads 2 --load busy --blocks 3 --repeat 10 --shard 1/2 &
    run 6,7 busy2.txt --threads 2 --load busy --blocks 3 --repeat 10 --shard 2/2 &
    run 8 alone1.txt --threads 1 &
    wait
    ;;
many)
    run 0-15 alone16.txt --threads 16
    ;;
*)
    echo "unknown part $part (pairs or many)" >&2
    exit 2
    ;;
esac
tail -n 3 "$out"/*.txt
