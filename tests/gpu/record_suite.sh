# shellcheck shell=bash
# `prism-run record` on several GPUs (issue 10; docs/record.md). Sourced by tests/gpu/run.sh (suite `record`).
# Per configuration (RECORD_CASES, default "dp2 tp2"; world W = 2 needs 2 GPUs): unmodified Megatron-LM natively and
# under `prism-run record`, alternating, RECORD_REPS times each (default 3), RECORD_ITERS iterations (30) of the
# fidelity suite's model (tests/gpu/megatron_env.sh MEGATRON_MEDIUM_ARGS). Per run the median of Megatron's
# "elapsed time per iteration" after RECORD_SKIP (10) iterations (printed by the last rank); the median over runs of
# each side and their ratio (overhead; target < 1 %, printed, not asserted), then `prism-run simulate` of each
# recorded graph against the native median (how well the recorded, timed graph predicts the job).
# PASS: every run finished, was measured, and wrote observed.prism that simulate replays.
: "${out:?sourced by tests/gpu/run.sh}"
source tests/gpu/megatron_env.sh
RECORD_REPS=${RECORD_REPS:-3}
RECORD_ITERS=${RECORD_ITERS:-30}
RECORD_SKIP=${RECORD_SKIP:-10}
RECORD_T=${RECORD_T:-240}

record_case() {  # NAME: one configuration
  local name=$1 w=2 tp=1 pp=1
  case $name in
    dp2) ;;
    tp2) tp=2 ;;
    pp2) pp=2 ;;
    *) echo "unknown record configuration $name (dp2 tp2 pp2)"; return 1 ;;
  esac
  local ngpu; ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
  ((ngpu >= w)) || { echo "needs $w GPUs (found $ngpu)" | tee "$out/record_$name.detail"; return 1; }
  local d=$out/record/$name dp=$((w / (tp * pp)))
  mkdir -p "$d"
  job_of() {  # ITERS: the job's script and arguments
    job=(pretrain_gpt.py "${MEGATRON_MEDIUM_ARGS[@]}" --train-iters "$1"
      --global-batch-size $((${FIDELITY_MBS:-2} * dp * 4)) --tensor-model-parallel-size "$tp"
      --pipeline-model-parallel-size "$pp")
  }
  local -a job
  local devs; devs=$(seq -s, 0 $((w - 1)))
  # Why a warm-up: the first run of a kernel shape compiles (docs/fidelity.md); neither side should pay it.
  job_of 3
  (cd "$MEGATRON" && CUDA_VISIBLE_DEVICES=$devs timeout -s INT -k 20 "$RECORD_T" "$PYTHON" -m torch.distributed.run \
     --nproc-per-node "$w" "${job[@]}") > "$d/warmup.log" 2>&1
  job_of "$RECORD_ITERS"
  local r ok=0
  for ((r = 1; r <= RECORD_REPS; r++)); do
    (cd "$MEGATRON" && CUDA_VISIBLE_DEVICES=$devs timeout -s INT -k 20 "$RECORD_T" "$PYTHON" -m \
       torch.distributed.run --nproc-per-node "$w" "${job[@]}") > "$d/native.$r.log" 2>&1 || { echo "native $r failed"; ok=1; }
    (cd "$MEGATRON" && CUDA_VISIBLE_DEVICES=$devs timeout -s INT -k 20 "$RECORD_T" "$PRISM_RUN" record --gpus "$w" \
       --out "$d/record.$r" --quiet torchrun --nproc-per-node "$w" "${job[@]}") > "$d/record.$r.out" 2>&1 \
       || { echo "record $r failed"; ok=1; }
    if [ -f "$d/record.$r/observed.prism" ]; then
      "$PRISM_RUN" simulate "$d/record.$r/observed.prism" --out "$d/record.$r/simulate" --quiet \
        > "$d/record.$r/simulate.log" 2>&1 || { echo "simulate $r failed"; ok=1; }
    else
      echo "record $r: no observed.prism"; ok=1
    fi
  done
  "$PYTHON" - "$d" "$RECORD_REPS" "$RECORD_SKIP" "$((w - 1))" > "$out/record_$name.detail" <<'PY' || ok=1
import json, os, re, statistics, sys
d, reps, skip, last = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
def med(path):
    try:
        t = [float(x) for x in re.findall(r"elapsed time per iteration \(ms\): ([0-9.]+)", open(path, errors="replace").read())]
    except OSError:
        return None
    return statistics.median(t[skip:]) if len(t) > skip else None
def sim(r):
    try:
        return 1e3 * json.load(open(os.path.join(d, "record.%d" % r, "simulate", "report.json")))["iteration_time_s"]
    except (OSError, KeyError, ValueError, TypeError):
        return None
nat = [med(os.path.join(d, "native.%d.log" % r)) for r in range(1, reps + 1)]
rec = [med(os.path.join(d, "record.%d" % r, "logs", "rank%s.log" % last)) for r in range(1, reps + 1)]
sims = [sim(r) for r in range(1, reps + 1)]
fmt = lambda v: "/".join("-" if x is None else "%.1f" % x for x in v)
bad = any(x is None for x in nat + rec + sims)
n = [x for x in nat if x is not None]; c = [x for x in rec if x is not None]; s = [x for x in sims if x is not None]
line = "native ms %s" % fmt(nat)
if n and c:
    mn, mc = statistics.median(n), statistics.median(c)
    line += " -> %.1f; record %s -> %.1f; overhead %+.2f %% (target < 1 %%)" % (mn, fmt(rec), mc, 100 * (mc / mn - 1))
    if s:
        line += "; simulate(recorded) %s -> %.1f, %+.2f %% vs native" % (fmt(sims), statistics.median(s), 100 * (statistics.median(s) / mn - 1))
print(line)
sys.exit(1 if bad else 0)
PY
  return $ok
}
for c in ${RECORD_CASES:-dp2 tp2}; do
  check "record_$c" record_case "$c"
done
