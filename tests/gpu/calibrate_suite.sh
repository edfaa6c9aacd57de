#!/usr/bin/env bash
# Calibration on the GPU (issue 10; docs/calibrate.md): measure the intra-node NCCL collectives on the visible GPUs,
# fit a topology to them, and use it. Needs 2 or more GPUs (the nvidia-h200-x2 kind or larger).
#   calibrate_measure    prism-run calibrate with its defaults on every visible GPU: exit 0 within CAL_LIMIT s (default
#                        120; the aim is ~60 s on 2 H200s), both files written, NVLS off in the measurement file, every
#                        op measured; the detail has GPUs, NCCL, seconds, largest all-reduce busbw, the NCCL model's
#                        rms error before -> after and how many points it still misses by > 25 %
#   calibrate_refit      prism-run calibrate --from that file (the CPU path) fits the same keys again
#   calibrate_simulate   prism-run simulate examples/graphs/gpt-tp2-pp2-dp2.prism.json --topology <calibrated> exits 0;
#                        the detail compares its iteration time with the base preset's
#   calibrate_one_gpu    CUDA_VISIBLE_DEVICES=0 prism-run calibrate exits 1 and says at least 2 GPUs are needed
#
# usage: tests/gpu/calibrate_suite.sh OUT_DIR    (standalone: exit 0 only when every check passes)
#    or: tests/gpu/run.sh OUT_DIR calibrate     (sourced: uses its check, $out and $table)
# CAL_T (default 300) bounds each prism-run; CAL_ARGS adds options to the measuring run (e.g. "--gpus 2").

calibrate_suite_setup() {
  export PYTHON=${PYTHON:-/opt/torch/.venv/bin/python3}
  export PRISM_RUN=${PRISM_RUN:-$PWD/${PRISM_BUILD:-build}/bin/prism-run}
  CAL_T=${CAL_T:-300}
  CAL_LIMIT=${CAL_LIMIT:-120}
  CAL_DIR=$out/calibrate
  mkdir -p "$CAL_DIR"
}

cal_json() {  # FILE EXPR over `j` (parsed JSON)
  $PYTHON -c "import json,sys; j=json.load(open(sys.argv[1])); print($2)" "$1"
}

cal_measure() {
  local name=calibrate_measure
  rm -f "$CAL_DIR/topo.json" "$CAL_DIR/meas.json"
  nvidia-smi -L > "$CAL_DIR/gpus.txt" 2>&1
  local t0=$SECONDS
  # shellcheck disable=SC2086
  timeout -k 10 "$CAL_T" "$PRISM_RUN" calibrate --out "$CAL_DIR/topo.json" --measurements-out "$CAL_DIR/meas.json" \
    ${CAL_ARGS:-} > "$CAL_DIR/measure.out" 2>&1
  local rc=$? took=$((SECONDS - t0))
  echo "rc=$rc ${took}s gpus_visible=$(grep -c '^GPU' "$CAL_DIR/gpus.txt")" > "$out/$name.detail"
  cat "$CAL_DIR/measure.out"
  [ "$rc" = 0 ] || { echo "prism-run calibrate exited $rc"; tail -5 "$CAL_DIR/measure.out" >> "$out/$name.detail"; return 1; }
  [ -f "$CAL_DIR/meas.json" ] && [ -f "$CAL_DIR/topo.json" ] || { echo "files missing"; return 1; }
  cal_json "$CAL_DIR/meas.json" '"%d x %s, NCCL %s, %d points" % (j["gpu"]["count"], j["gpu"]["name"], j["nccl"]["version"], len(j["results"]))' >> "$out/$name.detail"
  cal_json "$CAL_DIR/meas.json" '"allreduce %d GPUs %d B busbw %.1f GB/s" % max((r["nranks"], r["bytes"], r["busbw_GBps"]) for r in j["results"] if r["op"] == "allreduce")' >> "$out/$name.detail"
  cal_json "$CAL_DIR/topo.json" '"nccl rms %.1f%% -> %.1f%%, poorly fitted %d; fitted %s" % (j["calibration"]["error"]["all"]["nccl_before"]["rms_pct"], j["calibration"]["error"]["all"]["nccl_after"]["rms_pct"], len(j["calibration"]["poorly_fitted"]), json.dumps(j["calibration"]["fitted"], separators=(",", ":")))' >> "$out/$name.detail"
  cal_json "$CAL_DIR/meas.json" 'j["nccl"]["env"].get("NCCL_NVLS_ENABLE") == "0"' | grep -q True || { echo "NVLS was not off"; return 1; }
  cal_json "$CAL_DIR/meas.json" 'sorted(set(r["op"] for r in j["results"]))' | grep -q "'allgather', 'allreduce', 'alltoall', 'broadcast', 'reducescatter', 'sendrecv'" \
    || { echo "an op is missing"; return 1; }
  [ "$took" -le "$CAL_LIMIT" ] || { echo "took ${took}s, limit ${CAL_LIMIT}s"; return 1; }
}

cal_refit() {
  local name=calibrate_refit
  [ -f "$CAL_DIR/meas.json" ] || { echo "no measurement file (calibrate_measure failed)"; return 1; }
  "$PRISM_RUN" calibrate --from "$CAL_DIR/meas.json" --out "$CAL_DIR/refit.json" > "$CAL_DIR/refit.out" 2>&1 || return 1
  local a b
  a=$(cal_json "$CAL_DIR/topo.json" 'json.dumps(j["calibration"]["fitted"], sort_keys=True)')
  b=$(cal_json "$CAL_DIR/refit.json" 'json.dumps(j["calibration"]["fitted"], sort_keys=True)')
  echo "same fit: $([ "$a" = "$b" ] && echo yes || echo no)" > "$out/$name.detail"
  [ "$a" = "$b" ] || { echo "fits differ: $a vs $b"; return 1; }
}

cal_simulate() {
  local name=calibrate_simulate graph=examples/graphs/gpt-tp2-pp2-dp2.prism.json
  [ -f "$CAL_DIR/topo.json" ] || { echo "no calibrated topology (calibrate_measure failed)"; return 1; }
  local base; base=$(cal_json "$CAL_DIR/topo.json" 'j["calibration"]["base_topology"]')
  "$PRISM_RUN" simulate "$graph" --topology "$CAL_DIR/topo.json" --no-use-recorded --out "$CAL_DIR/sim" || return 1
  "$PRISM_RUN" simulate "$graph" --topology "$base" --no-use-recorded --out "$CAL_DIR/sim_base" || return 1
  local t tb
  t=$(cal_json "$CAL_DIR/sim/report.json" 'j["iteration_time_s"]')
  tb=$(cal_json "$CAL_DIR/sim_base/report.json" 'j["iteration_time_s"]')
  echo "iteration ${t} s calibrated, ${tb} s with $base (model only, --no-use-recorded)" > "$out/$name.detail"
}

cal_one_gpu() {
  local name=calibrate_one_gpu
  CUDA_VISIBLE_DEVICES=0 timeout -k 10 120 "$PRISM_RUN" calibrate --out "$CAL_DIR/one/topo.json" > "$CAL_DIR/one.out" 2>&1
  local rc=$?
  echo "rc=$rc: $(tail -1 "$CAL_DIR/one.out" | cut -c1-140)" > "$out/$name.detail"
  [ "$rc" = 1 ] && grep -q "at least 2 needed" "$CAL_DIR/one.out"
}

calibrate_suite_main() {
  calibrate_suite_setup
  [ -x "$PRISM_RUN" ] || { echo "no $PRISM_RUN: build prism-run first"; return 2; }
  check calibrate_measure cal_measure
  check calibrate_refit cal_refit
  check calibrate_simulate cal_simulate
  check calibrate_one_gpu cal_one_gpu
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -uo pipefail
  out=$(realpath -m "${1:?usage: tests/gpu/calibrate_suite.sh OUT_DIR}")
  mkdir -p "$out"
  table=$out/table.txt; : > "$table"
  check() {
    local name=$1; shift
    local t0=$SECONDS st
    if "$@" > "$out/$name.log" 2>&1; then st=PASS; else st=FAIL; fi
    local detail=""; [ -f "$out/$name.detail" ] && detail=$(tr '\n' ' ' < "$out/$name.detail")
    printf '%-34s %-4s %4ss  %s\n' "$name" "$st" $((SECONDS - t0)) "$detail" | tee -a "$table"
  }
  calibrate_suite_main
  echo; echo "== calibrate suite"; cat "$table"
  ! grep -q ' FAIL ' "$table"
  exit $?
else
  calibrate_suite_main || true
fi
