#!/usr/bin/env bash
# libprism's gates' cost within ONE run (issue 27; docs/libprism.md "Cost on a real rank"): `prism-run --policy
# mirror --ranks 0` of the medium GPT at world 1 with PRISM_GATE_TOGGLE=N: units gated for N iterations, not gated
# for the next N, and so on (switched at the iteration marks). PRISM_FIXED_DUR_US=0.001: every unit lasts 1 ns, so
# it is gated (a unit of duration 0 holds no gate) and its gate is due at once: whatever the gated blocks take more
# is the gates' own cost (the progress thread's round trip, a held stream holding the others behind it under
# CUDA_DEVICE_MAX_CONNECTIONS=1), what each gate adds at any world size beyond its due time. Per-iteration GPU times from report.json (iteration stamps); the first
# iteration of each block and the first SKIP are left out; prints the pooled medians gated and not, their ratio,
# the median of neighbouring blocks' ratios and a bootstrap interval over whole blocks (fixed seed).
#   tests/gpu/overhead_toggle.sh OUT      TOGGLE_N (10), TOGGLE_ITERS (120), SKIP (2), PAIRS_SEQ (2048), PAIRS_MBS (2)
# Writes OUT/toggle.txt (its last line the summary) and the run's log.
set -uo pipefail
out=$(realpath -m "${1:?usage: overhead_toggle.sh OUT}"); mkdir -p "$out"
PRISM_BUILD=${PRISM_BUILD:-$PWD/build}
n=${TOGGLE_N:-10} iters=${TOGGLE_ITERS:-120} skip=${SKIP:-2}
FIDELITY_SEQ=${PAIRS_SEQ:-2048} FIDELITY_MBS=${PAIRS_MBS:-2}
source tests/gpu/megatron_env.sh
job=(pretrain_gpt.py "${MEGATRON_MEDIUM_ARGS[@]}" --global-batch-size 8 --train-iters "$iters")
(cd "$MEGATRON" && PRISM_GATE_TOGGLE=$n PRISM_FIXED_DUR_US=0.001 timeout 540 "$PRISM_BUILD/bin/prism-run" --policy mirror --ranks 0 \
   --out "$out/run" --quiet torchrun --nproc-per-node 1 "${job[@]}") > "$out/run.log" 2>&1
cat "$out/run/logs/rank0.log" >> "$out/run.log" 2>/dev/null
"$PYTHON" - "$out/run/report.json" "$n" "$skip" "$(dirname "$0")" > "$out/toggle.txt" <<'PY'
import json, statistics, sys
sys.path.insert(0, sys.argv[4])
from toggle_blocks import block_stats
n, skip = int(sys.argv[2]), int(sys.argv[3])
s = block_stats(json.load(open(sys.argv[1]))["ranks"][0]["iteration_times_s"], n, skip)
if not s["enough"]:
    print("too few iterations: gated %d, not gated %d" % (len(s["on"]), len(s["off"]))); sys.exit(1)
mn, mo, pairs = s["median_on"], s["median_off"], s["pairs"]
print("blocks gated/not: " + " ".join("%.3f" % p for p in pairs))
print("gate toggle %d: ms/iter gated %.3f (%d it), not gated %.3f (%d it), ratio %.4f (%+.2f %%); neighbouring "
      "blocks median %.4f over %d; bootstrap 95 %% interval %.4f..%.4f" % (
      n, mn, len(s["on"]), mo, len(s["off"]), mn / mo, 100 * (mn / mo - 1), statistics.median(pairs), len(pairs),
      s["boot_lo"], s["boot_hi"]))
PY
rc=$?
cat "$out/toggle.txt"
exit $rc
