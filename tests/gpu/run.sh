#!/usr/bin/env bash
# The GPU suite: one entry script, run on the GPU machine from the repo root over a build made elsewhere
# (carry build/ and third_party/megatron/). Prints a PASS/FAIL table and writes logs under OUT_DIR.
#   tests/gpu/run.sh OUT_DIR [suite...]      suites: shim megatron hang passthrough fidelity calibrate record kernels swap
#                                            cost (libprism's added time, bottom-up: tests/gpu/libprism_cost.sh)
#                                            pairs (native vs prism-run alternating: tests/gpu/overhead_pairs.sh)
#                                            toggle (the gates' cost within one run: tests/gpu/overhead_toggle.sh)
#                                            (default: shim megatron)
set -uo pipefail
out=$(realpath -m "${1:?usage: tests/gpu/run.sh OUT_DIR [suite...]}"); shift
mkdir -p "$out"
suites=("$@"); ((${#suites[@]})) || suites=(shim megatron)
export PRISM_BUILD=${PRISM_BUILD:-$PWD/build}
export PRISM_RUN=$PRISM_BUILD/bin/prism-run PRISM_LIB=$PRISM_BUILD/lib/libprism.so
export NCCL_NVLS_ENABLE=0 NCCL_NVLINK_SHARP_ENABLE=0 PYTHONUNBUFFERED=1
# The suites' cases measure one emulation each (mirror unless they pass --graph); the default procedure's own cases
# (megatron_suite.sh "default") unset it.
export PRISM_POLICY=${PRISM_POLICY:-mirror}
table=$out/table.txt; : > "$table"
# check NAME CMD...: runs CMD, records PASS/FAIL; CMD may append "detail" lines to $out/NAME.detail
check() {
  local name=$1; shift
  local t0=$SECONDS
  if "$@" > "$out/$name.log" 2>&1; then st=PASS; else st=FAIL; fi
  local detail=""; [ -f "$out/$name.detail" ] && detail=$(tr '\n' ' ' < "$out/$name.detail")
  printf '%-34s %-4s %4ss  %s\n' "$name" "$st" $((SECONDS - t0)) "$detail" | tee -a "$table"
}
export -f check
export out
for s in "${suites[@]}"; do
  case $s in
    shim) [ -x tests/gpu/shim_suite.sh ] && source tests/gpu/shim_suite.sh ;;
    megatron) source tests/gpu/megatron_suite.sh ;;
    hang) source tests/gpu/hang_suite.sh ;;
    calibrate) source tests/gpu/calibrate_suite.sh ;;
    record) source tests/gpu/record_suite.sh ;;
    swap) source tests/gpu/swap_suite.sh ;;
    fidelity) source tests/gpu/fidelity_suite.sh ;;
    passthrough) source tests/gpu/passthrough_suite.sh ;;
    kernels) source tests/gpu/kernels_suite.sh ;;
    cost) cost_case() {  # PASS: the bottom-up estimate of libprism's added time is under 1 % of the iteration
            tests/gpu/libprism_cost.sh "$out/cost" || return 1
            grep '^world ' "$out/cost/cost.txt" | sed -E 's/^(world [0-9]+):.* = ([-0-9.]+ %).*/\1 \2/' | paste -sd ';' > "$out/libprism_cost_bottom_up.detail"
            # every world's estimate (world 1, and world 64 unless COST_W64=0) under 1 %
            ! grep '^world ' "$out/cost/cost.txt" | grep -vqE '= (0\.[0-9]+|-[0-9.]+) %' &&
              [ "$(grep -c '^world ' "$out/cost/cost.txt")" -ge 1 ]
          }
          check libprism_cost_bottom_up cost_case ;;
    pairs) pairs_case() {  # PASS: the median pair ratio is under 1.01 or the interval reaches below it (the noise allows)
             tests/gpu/overhead_pairs.sh "$out/pairs" || return 1
             tail -1 "$out/pairs/pairs.txt" > "$out/libprism_cost_pairs.detail"
             tail -1 "$out/pairs/pairs.txt" | awk '{m = $3; split($10, iv, /\.\./); exit !(m < 1.01 || iv[1] < 1.01)}'
           }
           check libprism_cost_pairs pairs_case ;;
    toggle) toggle_case() {  # PASS: the gated blocks within 1 % of the ungated ones, or the interval reaching below
              tests/gpu/overhead_toggle.sh "$out/toggle" || return 1
              tail -1 "$out/toggle/toggle.txt" > "$out/libprism_gate_toggle.detail"
              tail -1 "$out/toggle/toggle.txt" | awk '{split($NF, iv, /\.\./); r = $15; exit !(r < 1.01 || iv[1] < 1.01)}'
            }
            check libprism_gate_toggle toggle_case ;;
    *) echo "unknown suite $s" >&2 ;;
  esac
done
echo; echo "== GPU suite"; cat "$table"
! grep -q ' FAIL ' "$table"
