#!/usr/bin/env bash
# Prism's cost when nothing is emulated away: Megatron's tiny GPT, world 1, natively; under prism-run with the world
# on the real NCCL (PRISM_PASSTHROUGH_MIN_MEMBERS=1: libprism loaded, every communicator passes through); under
# prism-run emulated (the default: libprism's own one-member communicators); and natively with only libprism
# preloaded (no prism-run, no coordinator, no virtual devices). Interleaved REPS times; each run's median of
# Megatron's "elapsed time per iteration" after the first SKIP; then the median over runs and the ratio to native.
#   tests/gpu/overhead_bench.sh OUT [REPS=3] [ITERS=40] [SKIP=10]
set -uo pipefail
out=$(realpath -m "${1:?usage: overhead_bench.sh OUT [REPS] [ITERS] [SKIP]}"); reps=${2:-3}; iters=${3:-40}; skip=${4:-10}
mkdir -p "$out"
PRISM_BUILD=${PRISM_BUILD:-$PWD/build}
PRISM_RUN=$PRISM_BUILD/bin/prism-run
source tests/gpu/megatron_env.sh
job=(pretrain_gpt.py "${MEGATRON_TINY_ARGS[@]}" --global-batch-size 4 --train-iters "$iters")
run() {  # KIND REP
  local kind=$1 rep=$2 log=$out/$1.$2.log
  case $kind in
    native) (cd "$MEGATRON" && timeout 200 "$PYTHON" -m torch.distributed.run --nproc-per-node 1 "${job[@]}") > "$log" 2>&1 ;;
    preload) (cd "$MEGATRON" && LD_PRELOAD=$PRISM_BUILD/lib/libprism.so timeout 200 "$PYTHON" -m torch.distributed.run \
               --nproc-per-node 1 "${job[@]}") > "$log" 2>&1 ;;
    passthrough) (cd "$MEGATRON" && PRISM_PASSTHROUGH_MIN_MEMBERS=1 timeout 200 "$PRISM_RUN" --ranks 0 --gpus 1 \
                   --out "$out/$kind.$rep" --quiet torchrun --nproc-per-node 1 "${job[@]}") > "$log" 2>&1
                 cat "$out/$kind.$rep"/logs/rank0.log >> "$log" ;;
    emulated) (cd "$MEGATRON" && timeout 200 "$PRISM_RUN" --ranks 0 --gpus 1 --out "$out/$kind.$rep" --quiet \
                torchrun --nproc-per-node 1 "${job[@]}") > "$log" 2>&1
              cat "$out/$kind.$rep"/logs/rank0.log >> "$log" ;;
  esac
}
(cd "$MEGATRON" && timeout 200 "$PYTHON" -m torch.distributed.run --nproc-per-node 1 \
   "${job[@]:0:${#job[@]}-1}" 3) > "$out/warmup.log" 2>&1
for ((r = 1; r <= reps; r++)); do
  for k in native preload passthrough emulated; do run $k $r; done
done
"$PYTHON" - "$out" "$reps" "$skip" <<'PY'
import re, statistics, sys, os
out, reps, skip = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def med(path):
    t = [float(x) for x in re.findall(r"elapsed time per iteration \(ms\): ([0-9.]+)", open(path).read())]
    return statistics.median(t[skip:]) if len(t) > skip else float("nan")
rows = {}
for k in ["native", "preload", "passthrough", "emulated"]:
    rows[k] = [med(os.path.join(out, "%s.%d.log" % (k, r))) for r in range(1, reps + 1)]
base = statistics.median(rows["native"])
print("%-12s %-28s %10s %8s" % ("run", "per-run medians (ms)", "median", "ratio"))
for k, v in rows.items():
    m = statistics.median(v)
    print("%-12s %-28s %10.2f %8.3f" % (k, " ".join("%.2f" % x for x in v), m, m / base))
PY
