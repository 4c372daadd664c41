#!/bin/sh
# bench/cpu.py's tables in two commands on a machine of 16 cores or more (the GPU machine's
# host), each runtime on the same cores:
#     sh bench/cpu_all.sh OUT_DIR pairs    2-thread tables (alone, alternating, beside a busy
#                                          process) and 1 thread alone, each table in two
#                                          shards: 8 runs at once, each on its own cores
#     sh bench/cpu_all.sh OUT_DIR many     every model alone with 16 threads
# Runs on disjoint cores still share the L3 and memory bandwidth: the 2-core machine's own
# figures come from bench/cpu.py run there. Model sets: bench/cpu.py's docstring; MODELS=...
# picks others, LIMIT=seconds stops each run (its table so far is kept), OPTIONS=... adds
# bench/cpu.py options to every run.
cd "$(dirname "$0")/.." || exit 2
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
out=${1:?OUT_DIR}
part=${2:-pairs}
models=${MODELS:-zoo,library,library-dynamo,light}
mkdir -p "$out"
# exported once, before the runs that read them (concurrent runs would race to write them)
python -c "import sys; sys.path.insert(0, 'bench'); import cpu; cpu.expand_models('$models')" \
    > "$out/exports.txt" 2>&1
run() {   # cores, file, options
    cores=$1 file=$2
    shift 2
    # shellcheck disable=SC2086 - OPTIONS is a list of options
    timeout "${LIMIT:-86400}" taskset -c "$cores" python bench/cpu.py --models "$models" \
        $OPTIONS "$@" > "$out/$file" 2>&1
}
case $part in
pairs)
    for k in 1 2; do
        c=$(( (k - 1) * 2 ))
        run $c,$((c + 1)) "alone2_$k.txt" --threads 2 --shard $k/2 &
        run $((c + 4)),$((c + 5)) "alternate_$k.txt" --threads 2 --load alternate \
            --blocks 3 --repeat 10 --shard $k/2 &
        run $((c + 8)),$((c + 9)) "busy_$k.txt" --threads 2 --load busy --blocks 3 \
            --repeat 10 --shard $k/2 &
        run $((11 + k)) "alone1_$k.txt" --threads 1 --shard $k/2 &
    done
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
grep -h "geometric" "$out"/*.txt
