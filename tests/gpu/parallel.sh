#!/usr/bin/env bash
# Runs GPU suites side by side, one group per GPU, then packs the logs so that a `device` call returns them in a
# few files (a call returns a limited number of files: logs left unpacked past that number are lost).
#   tests/gpu/parallel.sh OUT 'SWAP_STALL=2 SWAP_TIMEOUT=400 swap' 'KERNELS_CASES=toggle kernels; SHIM_PARTS=4b shim'
# Group k (0-based) runs on GPU k (CUDA_VISIBLE_DEVICES=k); its steps, separated by ';', run one after the other,
# each `VAR=value... SUITE...` as `VAR=value... tests/gpu/run.sh WORK/g<k>.<step> SUITE...`. PARALLEL_T (default
# 560 s) bounds each step and PARALLEL_DEADLINE (default 570 s from the start) all of them, so that the packing
# below runs before a `device` call's 600 s limit. A comma in a value stands for a space (the group is split on
# spaces): 'MEGATRON_CASES=collect,fill megatron'. Writes OUT/g<k>.txt (the group's output and tables), OUT/logs.tgz (the suites'
# directories without event, kernel and payload files) and OUT/traces.tgz (trace.json files under 5 MB), and prints
# the tables. KEEP=DIR puts the suites' directories under DIR instead of a scratch folder that is removed (e.g. the
# git-ignored .keep/, which a later call on the still-warm machine can re-use). PARALLEL_ONE_GPU=1 runs every group
# on GPU 0 side by side (for cases whose check is not a timing: memory, a pipeline bubble's presence).
# PARALLEL_TOP=N writes OUT/top.txt: the busy processes every N seconds (top -b -i), to see what shares the host.
set -uo pipefail
out=$(realpath -m "${1:?usage: tests/gpu/parallel.sh OUT 'GROUP' ['GROUP'...]}"); shift
mkdir -p "$out"
work=${KEEP:-$out/work}; mkdir -p "$work"
start=$SECONDS deadline=${PARALLEL_DEADLINE:-570}
# PARALLEL_BIND=1 (default): each group runs on the CPUs local to its GPU (sysfs local_cpulist of the GPU's PCI
# device, through taskset), so that on a machine of several NUMA nodes a launch-bound model's host thread is not placed
# on the far socket. On a machine of one NUMA node (the nvidia-h200-x2 kind: both GPUs, CPUs 0-31) it changes
# nothing; there a launch-bound model's own time moves with the other group's load instead (a swap case's host
# traffic: the medium GPT's rank 0 computed 70.7 ms per iteration beside it, 49.1 ms after it; docs/results/fill.md).
cpus_of_gpu() {  # GPU index -> its local cpulist, or nothing
  local bus
  bus=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader -i "$1" 2>/dev/null | tr 'A-F' 'a-f') || return
  [ -n "$bus" ] || return
  cat "/sys/bus/pci/devices/${bus#0000}/local_cpulist" 2>/dev/null || cat "/sys/bus/pci/devices/${bus:4}/local_cpulist" 2>/dev/null
}
if [ -n "${PARALLEL_TOP:-}" ] && command -v top > /dev/null; then
  top -b -i -c -w 200 -d "$PARALLEL_TOP" -n $((deadline / PARALLEL_TOP + 1)) 2>/dev/null |
    grep -v '^ *$' | cut -c1-200 > "$out/top.txt" &
  top_pid=$!
fi
k=0 group_pids=()
for group in "$@"; do
  gpu=$k
  [ "${PARALLEL_ONE_GPU:-}" = 1 ] && gpu=0
  bind=()
  if [ "${PARALLEL_BIND:-1}" = 1 ] && command -v taskset > /dev/null; then
    cpus=$(cpus_of_gpu "$gpu")
    [ -n "$cpus" ] && bind=(taskset -c "$cpus")
  fi
  (
    export CUDA_VISIBLE_DEVICES=$gpu
    echo "== GPU $gpu (group $k): CPUs ${bind[2]:-all} (PARALLEL_BIND=${PARALLEL_BIND:-1})"
    IFS=';' read -ra steps <<< "$group"
    for ((st = 0; st < ${#steps[@]}; st++)); do
      envs=() suites=()
      for w in ${steps[$st]}; do
        if [[ "$w" == *=* ]]; then envs+=("${w//,/ }"); else suites+=("$w"); fi
      done
      ((${#suites[@]})) || continue
      left=$((deadline - (SECONDS - start))) t=${PARALLEL_T:-560}
      ((left < t)) && t=$left
      ((t > 10)) || { echo "== step $st: no time left"; continue; }
      echo "== step $st (${t} s): ${steps[$st]}"
      "${bind[@]}" env "${envs[@]}" timeout "$t" tests/gpu/run.sh "$work/g$k.$st" "${suites[@]}"
    done
  ) > "$out/g$k.txt" 2>&1 &
  group_pids+=($!)
  k=$((k + 1))
done
wait "${group_pids[@]}"
[ -n "${top_pid:-}" ] && pkill -P $$ top 2>/dev/null
(cd "$work" && tar czf "$out/logs.tgz" --exclude='*.events.jsonl' --exclude='*.kernels.jsonl' --exclude='payloads' \
   --exclude='*.sock' --exclude='*.bin' . ) 2>/dev/null
find "$work" -name trace.json -size -5M -print0 | (cd / && tar czf "$out/traces.tgz" --null -T - 2>/dev/null)
# PARALLEL_EVENTS=1: the event files too (each under 20 MB), for reading a fill's slices afterwards.
if [ -n "${PARALLEL_EVENTS:-}" ]; then
  find "$work" -name '*.events.jsonl' -size -20M -print0 | (cd "$work" && tar czf "$out/events.tgz" --null -T - 2>/dev/null)
fi
[ -z "${KEEP:-}" ] && rm -rf "$work"
for ((i = 0; i < k; i++)); do echo "== group $i (GPU $i)"; grep -A40 '^== GPU suite' "$out/g$i.txt" | grep -v '^== GPU suite'; done
