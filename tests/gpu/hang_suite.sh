#!/usr/bin/env bash
# Hang diagnosis on the GPU (issue 9, "Shown" cases 1-3; docs/hang.md). Plain torch (tests/gpu/hang_job.py), world
# 1024, tp 16 (data-parallel groups of 64 strided ranks), real ranks 5 and 517 (one data-parallel group) on the one
# GPU, every other rank virtual:
#   hang_skip_allreduce   rank 517 skips the all_reduce of iteration 3 (HANG_CASE=skip): prism reports, within
#                         --hang-timeout + 10 s of the skip, an op mismatch at one sequence of the data-parallel group,
#                         named (517 all_gather, 5 all_reduce; the group's description is in the detail), exits 4, and writes hang.json and both ranks' FR dumps;
#                         `prism-run status --flight-recorder` on those dumps names --ranks 5,517
#   hang_fr_torch_reader  torch's own Flight Recorder analyzer (python -m torch.distributed.flight_recorder.fr_trace)
#                         reads those dumps, real and virtual (64: the data-parallel group), exits 0 and reports the
#                         collective type mismatch (its output is kept)
#   hang_p2p_cycle        5 and 517 both send to each other first (HANG_CASE=p2p): the wait-for cycle 5 -> 517 -> 5
#   hang_size_mismatch    517 all_reduces 1 MiB where 5 all_reduces 2 MiB (HANG_CASE=size): a size mismatch
#   hang_size_fr_torch_reader  torch's analyzer on those dumps (64) reports SIZE_OR_SYNTAX_MISMATCH
#   hang_control          no bug: the job finishes (exit 0) and no hang.json is written
#   hang_two_hosts        the skip with 5 and 517 in two prism-runs ("hosts": the coordinator's, serving TCP on
#                         127.0.0.1, and one joining with --coordinator): diagnosed once, both exit 4
# Why two real ranks: with one real rank every virtual peer mirrors it (payload mirror), so a skipped collective is
# invisible; a second real member that does not skip is the witness (docs/hang.md, "What makes a hang observable").
#
# usage: tests/gpu/hang_suite.sh OUT_DIR    (standalone: exit 0 only when every check passes)
#    or: tests/gpu/run.sh OUT_DIR hang      (sourced: uses its check, $out and $table)
# HANG_TIMEOUT (default 20) is prism's --hang-timeout; HANG_T (default 300) bounds each run; HANG_CASES picks cases
# (skip fr p2p size size_fr control two_hosts).

hang_suite_setup() {
  export PYTHON=${PYTHON:-/opt/torch/.venv/bin/python3}
  export PYTHON_EXEC=$PYTHON
  export PRISM_RUN=${PRISM_RUN:-$PWD/${PRISM_BUILD:-build}/bin/prism-run}
  export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
  HANG_TIMEOUT=${HANG_TIMEOUT:-20}
  HANG_T=${HANG_T:-300}
}

# hang_run NAME CASE [prism args...]: one prism-run of hang_job.py; its exit status in $out/NAME.rc, the wall time
# at which prism-run returned in $out/NAME.end
hang_run() {
  local name=$1 case=$2; shift 2
  local dir=$out/$name
  rm -rf "$dir"
  HANG_CASE=$case timeout -s INT -k 20 "$HANG_T" "$PRISM_RUN" --ranks 5,517 --out "$dir" --hang-timeout "$HANG_TIMEOUT" \
    "$@" torchrun --nnodes 128 --nproc-per-node 8 tests/gpu/hang_job.py > "$out/$name.out" 2>&1
  echo $? > "$out/$name.rc"
  date +%s.%N > "$out/$name.end"
}

hang_json() {  # FILE EXPR over `h` (parsed JSON)
  $PYTHON -c "import json,sys; h=json.load(open(sys.argv[1])); print($2)" "$1"
}

# When the bug ran (the earliest HANG_BUG line of either rank).
hang_bug_time() {
  grep -h "HANG_BUG t=" "$out/$1"/logs/rank*.log 2>/dev/null | sed -E 's/.*HANG_BUG t=([0-9.]+).*/\1/' | sort -n | head -1
}

hang_skip() {
  local name=hang_skip_allreduce dir=$out/hang_skip_allreduce
  hang_run $name skip
  local rc; rc=$(cat "$out/$name.rc")
  local bug; bug=$(hang_bug_time $name)
  local took; took=$(awk -v a="$bug" -v b="$(cat "$out/$name.end")" 'BEGIN{ if (a=="") print "?"; else printf "%.1f", b-a }')
  echo "rc=$rc bug_to_exit_s=$took (limit $((HANG_TIMEOUT + 10)))" > "$out/$name.detail"
  [ -f "$dir/hang.json" ] || { echo "no hang.json"; tail -30 "$out/$name.out"; return 1; }
  hang_json "$dir/hang.json" '"; ".join("%s seq %s: %s" % (m["group"], m["seq"], ", ".join("%d %s %s B" % (o["rank"], o["op"], o["bytes"]) for o in m["ops"])) for m in h["mismatches"])' >> "$out/$name.detail"
  local fr="$dir/flight_recorder"
  [ -f "$fr/nccl_trace_rank_5" ] && [ -f "$fr/nccl_trace_rank_517" ] || { echo "FR dumps missing"; return 1; }
  "$PRISM_RUN" status --flight-recorder "$fr" > "$out/$name.fr.txt" 2>&1
  grep -o -- "--ranks [0-9,]*" "$out/$name.fr.txt" | head -1 | sed 's/^/fr: /' >> "$out/$name.detail"
  "$PRISM_RUN" status "$dir" > "$out/$name.status.txt" 2>&1
  [ "$rc" = 4 ] || { echo "exit $rc, expected 4"; return 1; }
  awk -v t="$took" -v l=$((HANG_TIMEOUT + 10)) 'BEGIN{ exit !(t != "?" && t <= l) }' || { echo "too slow: $took s"; return 1; }
  hang_json "$dir/hang.json" \
    'any("op" in m["differs"] and {o["rank"]: o["op"] for o in m["ops"]} == {5: "all_reduce", 517: "all_gather"} and m["group"] != "" for m in h["mismatches"])' \
    | grep -q True || { echo "hang.json does not name the op mismatch and its group"; return 1; }
  grep -q -- "--ranks 5,517" "$out/$name.fr.txt" || { echo "FR reading does not name ranks 5,517"; return 1; }
}

# Two "hosts" on this machine (issue 9): rank 5's prism-run starts the coordinator and serves the other host over
# TCP (--listen 127.0.0.1 --remote-ranks 517), rank 517's joins it (--coordinator, --node-rank 1); the planted skip
# must be diagnosed once, and both stop with exit 4 (the joining one reads the diagnosis from the store).
hang_two_hosts() {
  local name=hang_two_hosts base=$out/hang_two_hosts port=29640
  rm -rf "$base"
  mkdir -p "$base"
  HANG_CASE=skip timeout -s INT -k 20 "$HANG_T" "$PRISM_RUN" --ranks 5 --remote-ranks 517 --listen 127.0.0.1 \
    --out "$base/host0" --hang-timeout "$HANG_TIMEOUT" torchrun --nnodes 128 --nproc-per-node 8 --master-port $port \
    tests/gpu/hang_job.py > "$out/$name.host0.out" 2>&1 &
  local p0=$!
  sleep 5
  HANG_CASE=skip timeout -s INT -k 20 "$HANG_T" "$PRISM_RUN" --coordinator 127.0.0.1:$port --ranks 517 --node-rank 1 \
    --out "$base/host1" --hang-timeout "$HANG_TIMEOUT" torchrun --nnodes 128 --nproc-per-node 8 --master-port $port \
    tests/gpu/hang_job.py > "$out/$name.host1.out" 2>&1
  local rc1=$?
  wait $p0
  local rc0=$?
  echo "rc host0=$rc0 host1=$rc1" > "$out/$name.detail"
  [ -f "$base/host0/hang.json" ] || { echo "no hang.json on host0"; tail -20 "$out/$name.host0.out"; return 1; }
  hang_json "$base/host0/hang.json" '"; ".join("%s seq %s: %s" % (m["group"], m["seq"], ", ".join("%d %s" % (o["rank"], o["op"]) for o in m["ops"])) for m in h["mismatches"])' >> "$out/$name.detail"
  [ "$rc0" = 4 ] && [ "$rc1" = 4 ] || { echo "expected both to exit 4"; return 1; }
  hang_json "$base/host0/hang.json" \
    'any({o["rank"]: o["op"] for o in m["ops"]} == {5: "all_reduce", 517: "all_gather"} for m in h["mismatches"])' \
    | grep -q True || { echo "hang.json does not name the op mismatch"; return 1; }
}

# hang_fr_torch_on RUN CASE_NAME KIND: torch's own analyzer on RUN's dumps, real and virtual (PRISM_FR_VIRTUAL,
# docs/hang.md): every rank of 5's and 517's data-parallel group {5, 21, ..., 1013} (64) must have one, else torch
# stops at "Missing dump files"; it must exit 0 and report KIND (the error type of the disagreement; which rank it
# names as the culprit depends on which dump it loaded first, docs/hang.md).
hang_fr_torch_on() {
  local run=$1 name=$2 kind=$3
  local fr=$out/$run/flight_recorder
  [ -d "$fr" ] || { echo "no dumps ($run failed)"; return 1; }
  local n; n=$(ls "$fr" | grep -c '^nccl_trace_rank_[0-9]*$')
  # Why these flags: harmless when every dump is there; a group left out (PRISM_FR_VIRTUAL_MAX) would otherwise make
  # torch's analyzer abort before the covered group's disagreement (docs/hang.md "Dumps for virtual ranks").
  $PYTHON -m torch.distributed.flight_recorder.fr_trace --allow-incomplete-ranks --mismatch_cap 1000000 "$fr" \
    > "$out/$name.txt" 2>&1
  local rc=$?
  local culprit; culprit=$(grep -o 'Culprit rank [0-9]*' "$out/$name.txt" | sort -u | head -3 | tr '\n' ' ')
  echo "rc=$rc dumps=$n $culprit: $(grep -v '^\s*$' "$out/$name.txt" | tail -2 | tr '\n' ' ' | cut -c1-160)" \
    > "$out/$name.detail"
  [ "$rc" = 0 ] || return 1
  [ "$n" = 64 ] || { echo "expected 64 dumps (the data-parallel group), found $n"; return 1; }
  grep -q "$kind" "$out/$name.txt" || { echo "torch's analyzer does not report $kind"; return 1; }
}

hang_fr_torch() { hang_fr_torch_on hang_skip_allreduce hang_fr_torch_reader COLLECTIVE_TYPE_MISMATCH; }
hang_size_fr_torch() { hang_fr_torch_on hang_size_mismatch hang_size_fr_torch_reader SIZE_OR_SYNTAX_MISMATCH; }

hang_p2p() {
  local name=hang_p2p_cycle dir=$out/hang_p2p_cycle
  PRISM_SEND_RENDEZVOUS=1 hang_run $name p2p  # NCCL's send rendezvous (opt-in in libprism)
  local rc; rc=$(cat "$out/$name.rc")
  echo "rc=$rc" > "$out/$name.detail"
  [ -f "$dir/hang.json" ] || { echo "no hang.json"; tail -30 "$out/$name.out"; return 1; }
  hang_json "$dir/hang.json" '"cycles=%s mismatches=%s" % (h["cycles"], [m["differs"] for m in h["mismatches"]])' >> "$out/$name.detail"
  [ "$rc" = 4 ] || { echo "exit $rc, expected 4"; return 1; }
  hang_json "$dir/hang.json" '[5, 517] in h["cycles"]' | grep -q True || { echo "no cycle 5 -> 517"; return 1; }
}

hang_size() {
  local name=hang_size_mismatch dir=$out/hang_size_mismatch
  hang_run $name size
  local rc; rc=$(cat "$out/$name.rc")
  echo "rc=$rc" > "$out/$name.detail"
  [ -f "$dir/hang.json" ] || { echo "no hang.json"; tail -30 "$out/$name.out"; return 1; }
  hang_json "$dir/hang.json" '"; ".join("%s seq %s %s: %s" % (m["group"], m["seq"], m["differs"], ", ".join("%d %s %s B" % (o["rank"], o["op"], o["bytes"]) for o in m["ops"])) for m in h["mismatches"])' >> "$out/$name.detail"
  [ "$rc" = 4 ] || { echo "exit $rc, expected 4"; return 1; }
  hang_json "$dir/hang.json" \
    'any(m["differs"] == "size" and {o["rank"]: o["bytes"] for o in m["ops"]} == {5: 2097152, 517: 1048576} for m in h["mismatches"])' \
    | grep -q True || { echo "hang.json does not show the 2 MiB / 1 MiB size mismatch"; return 1; }
}

hang_control() {
  local name=hang_control dir=$out/hang_control
  hang_run $name none
  local rc; rc=$(cat "$out/$name.rc")
  echo "rc=$rc iterations=$(grep -c 'iteration .* done' "$dir/logs/rank517.log" 2>/dev/null)" > "$out/$name.detail"
  [ "$rc" = 0 ] && [ ! -f "$dir/hang.json" ]
}

hang_suite_main() {
  hang_suite_setup
  [ -x "$PRISM_RUN" ] || { echo "no $PRISM_RUN: build prism-run and libprism.so first"; return 2; }
  # HANG_CASES: which cases (default all, in this order; the fr readers need their run first)
  local c
  for c in ${HANG_CASES:-skip fr p2p size size_fr control two_hosts}; do
    case $c in
      skip) check hang_skip_allreduce hang_skip ;;
      fr) check hang_fr_torch_reader hang_fr_torch ;;
      p2p) check hang_p2p_cycle hang_p2p ;;
      size) check hang_size_mismatch hang_size ;;
      size_fr) check hang_size_fr_torch_reader hang_size_fr_torch ;;
      control) check hang_control hang_control ;;
      two_hosts) check hang_two_hosts hang_two_hosts ;;
      *) echo "hang suite: unknown case $c" ;;
    esac
  done
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -uo pipefail
  out=$(realpath -m "${1:?usage: tests/gpu/hang_suite.sh OUT_DIR}")
  mkdir -p "$out"
  table=$out/table.txt; : > "$table"
  check() {
    local name=$1; shift
    local t0=$SECONDS st
    if "$@" > "$out/$name.log" 2>&1; then st=PASS; else st=FAIL; fi
    local detail=""; [ -f "$out/$name.detail" ] && detail=$(tr '\n' ' ' < "$out/$name.detail")
    printf '%-34s %-4s %4ss  %s\n' "$name" "$st" $((SECONDS - t0)) "$detail" | tee -a "$table"
  }
  hang_suite_main
  echo; echo "== hang suite"; cat "$table"
  ! grep -q ' FAIL ' "$table"
  exit $?
else
  hang_suite_main || true
fi
