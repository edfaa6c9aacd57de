#!/usr/bin/env bash
# The observed graph (docs/collect.md) from real Megatron event files, on the GPU machine, repo root, build and
# third_party/megatron carried:   tests/gpu/observed_graph.sh OUT_DIR [case...]
# Cases (default: all):
#   dp8       world 8, tp=1 pp=1: --ranks 0 is the one class; emulate writes observed.prism by itself
#   w8rep     world 8, tp=2 pp=2, one data-parallel replica real (--ranks 0,1,4,5): 4 classes
#   w64rep    world 64, tp=2 pp=2, one replica real (--ranks 0,1,32,33): issue 7's case 1 without swapping
# Per case: emulate 10 iterations; observed.prism must be written and valid; `graph build --skip-iterations 1`
# rebuilds it; `simulate` must finish. Prints measured vs simulated iteration time (INFO: the graph has no
# cross-stream edges and its communication comes from the cost model, so they need not agree yet).
set -uo pipefail
out=$(realpath -m "${1:?usage: tests/gpu/observed_graph.sh OUT_DIR [case...]}"); shift
mkdir -p "$out"
cases=("$@"); ((${#cases[@]})) || cases=(dp8 w8rep w64rep)
PRISM_BUILD=${PRISM_BUILD:-$PWD/build}
PRISM_RUN=$PRISM_BUILD/bin/prism-run
source tests/gpu/megatron_env.sh
table=$out/table.txt; : > "$table"

run_case() {  # NAME RANKS NNODES NPROC TP PP GBS
  local name=$1 ranks=$2 nnodes=$3 nproc=$4 tp=$5 pp=$6 gbs=$7
  local dir=$out/$name
  rm -rf "$dir"; mkdir -p "$dir"
  (cd "$MEGATRON" && timeout -s INT -k 20 "${MEGATRON_TIMEOUT:-300}" "$PRISM_RUN" --ranks "$ranks" --out "$dir" \
     torchrun --nnodes "$nnodes" --nproc-per-node "$nproc" pretrain_gpt.py "${MEGATRON_TINY_ARGS[@]}" \
     --tensor-model-parallel-size "$tp" --pipeline-model-parallel-size "$pp" --global-batch-size "$gbs" \
     --train-iters 10) > "$dir.emulate.log" 2>&1
  local rc=$?
  grep -h "observed" "$dir.emulate.log" | tail -1 > "$dir.detail"
  [ $rc = 0 ] || { echo "emulate exit $rc" >> "$dir.detail"; return 1; }
  [ -f "$dir/observed.prism" ] || { echo "no observed.prism" >> "$dir.detail"; return 1; }
  "$PRISM_RUN" graph build "$dir" --skip-iterations 1 --out "$dir/g.prism" > "$dir.graph.log" 2>&1 ||
    { echo "graph build exit $?: $(head -c 300 "$dir.graph.log")" >> "$dir.detail"; return 1; }
  "$PRISM_RUN" simulate "$dir/g.prism" --out "$dir/sim" > "$dir.sim.log" 2>&1 ||
    { echo "simulate exit $?: $(grep -m1 -i 'deadlock\|error' "$dir.sim.log")" >> "$dir.detail"; return 1; }
  $PYTHON - "$dir" >> "$dir.detail" <<'PY'
import json, sys
d = sys.argv[1]
m = json.load(open(f"{d}/report.json")).get("iteration_time_s")
s = json.load(open(f"{d}/sim/report.json")).get("iteration_time_s")
print(f"INFO measured_iter_ms={m*1e3 if m else float('nan'):.2f} simulated_iter_ms={s*1e3 if s else float('nan'):.2f}")
PY
}

for c in "${cases[@]}"; do
  case $c in
    dp8) args=(observed_dp8 0 1 8 1 1 16) ;;
    w8rep) args=(observed_w8_tp2pp2_rep 0,1,4,5 1 8 2 2 16) ;;
    w64rep) args=(observed_w64_tp2pp2_rep 0,1,32,33 8 8 2 2 64) ;;
    *) echo "unknown case $c" >&2; continue ;;
  esac
  t0=$SECONDS
  if run_case "${args[@]}"; then st=PASS; else st=FAIL; fi
  name=${args[0]}
  printf '%-34s %-4s %4ss  %s\n' "$name" "$st" $((SECONDS - t0)) "$(tr '\n' ' ' < "$out/$name.detail")" | tee -a "$table"
done
echo; echo "== observed graph"; cat "$table"
! grep -q ' FAIL ' "$table"
