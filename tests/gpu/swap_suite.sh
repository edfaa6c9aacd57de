# Sourced by tests/gpu/run.sh (suite "swap"): context switching in `prism-run collect` (issue 7, docs/collect.md
# "Context switching"). Megatron tiny GPT, world 64, tp 2 pp 2: data-parallel replica 0 (ranks 0, 1, 32, 33)
#   swap_w64_resident  collected on the one GPU with all four ranks resident (no --swap: the baseline);
#   swap_w64_capped    again with --gpu-mem-cap at 2.5 x the largest rank's footprint from the first run (the
#                      largest per-process GPU memory nvidia-smi saw, else rank peak + 512 MiB context; also given as
#                      --rank-mem), so at most two ranks are on the GPU at once and the others are swapped out
#                      with the CUDA checkpoint API; checks swaps happened, no swap failed, every rank trained 10
#                      iterations; reports the GPU peak against the cap (peak_within_cap) and over-cap starts;
#   swap_w64_same_graph  both observed graphs hold the same communication (every class's streams with their
#                      communication nodes in order, the communicators, rank -> class; compute nodes are only counted:
#                      their gaps hold the swaps), and `prism-run simulate` runs on both.
# Run: tests/gpu/run.sh OUT swap      (SWAP_CASES="resident capped same_graph" by default, "big" on request; SWAP_STALL: --swap-stall
#   of the capped case, default 10 s: each torch store barrier a swapped-out rank must join costs that long;
#   SWAP_ITERS: the job's --train-iters for the w64 cases, default 10: the capped run takes ~32 s per iteration, so
#   SWAP_ITERS=5 fits one device call with the resident run)
#  or, without run.sh knowing the suite: bash tests/gpu/swap_suite.sh OUT   (from the repo root; same table)
if ! declare -F check > /dev/null; then
  out=$(realpath -m "${1:?usage: bash tests/gpu/swap_suite.sh OUT_DIR}"); mkdir -p "$out"
  export PRISM_BUILD=${PRISM_BUILD:-$PWD/build}
  export PRISM_RUN=$PRISM_BUILD/bin/prism-run PRISM_LIB=$PRISM_BUILD/lib/libprism.so
  export NCCL_NVLS_ENABLE=0 NCCL_NVLINK_SHARP_ENABLE=0 PYTHONUNBUFFERED=1
  table=$out/table.txt; : > "$table"
  check() {  # as tests/gpu/run.sh's
    local name=$1; shift
    local t0=$SECONDS st
    if "$@" > "$out/$name.log" 2>&1; then st=PASS; else st=FAIL; fi
    local detail=""; [ -f "$out/$name.detail" ] && detail=$(tr '\n' ' ' < "$out/$name.detail")
    printf '%-34s %-4s %4ss  %s\n' "$name" "$st" $((SECONDS - t0)) "$detail" | tee -a "$table"
  }
  swap_standalone=1
fi
source tests/gpu/megatron_env.sh
swap_json() {  # swap_json FILE EXPR  (EXPR in Python over `r`)
  $PYTHON -c "import json,sys; r=json.load(open(sys.argv[1])); print($2)" "$1"
}
swap_collect() {  # NAME [collect options...]
  local name=$1; shift
  local dir=$out/$name
  (cd "$MEGATRON" && timeout -s INT -k 20 "${SWAP_TIMEOUT:-900}" "$PRISM_RUN" collect --out "$dir" --no-payloads "$@" \
     torchrun --nnodes 8 --nproc-per-node 8 pretrain_gpt.py "${MEGATRON_TINY_ARGS[@]}" \
     --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --global-batch-size 64 --train-iters "${SWAP_ITERS:-10}") \
     > "$out/$name.out" 2>&1 || { echo "collect exit $?"; tail -30 "$out/$name.out"; return 1; }
  local rep=$dir/report.json
  [ -f "$rep" ] || { echo "no report.json"; return 1; }
  swap_json "$rep" '"iterations=%s iter_s=%.4f wall_s=%.1f peak_MiB=%s" % (r["iterations"], r["iteration_time_s"] or 0, r["wall_s"], [round((x.get("peak_memory_bytes") or 0)/2**20) for x in r["ranks"]])' > "$out/$name.detail"
  local want=$((${SWAP_ITERS:-10} - 1))
  [ "$(swap_json "$rep" 'r["iterations"]')" -ge "$want" ] || { echo "fewer than $want iterations"; return 1; }
  [ -f "$dir/observed.prism" ] || { echo "no observed.prism"; grep -i "observed\|class" "$out/$name.out" | tail -5; return 1; }
}
# The resident run also samples each process's GPU memory as NVML reports it (nvidia-smi, every 0.5 s): the
# footprint the scheduler measures with --swap (a CUDA context with NCCL and torch is ~1.3 GiB on the H200, far
# more than the tracked peak of ~100 MiB).
swap_resident() {
  local smp=$out/swap_w64_resident.nvml
  : > "$smp"
  ( while :; do nvidia-smi --query-compute-apps=used_memory --format=csv,noheader,nounits 2>/dev/null >> "$smp"; sleep 0.5; done ) &
  local sampler=$!
  swap_collect swap_w64_resident; local rc=$?
  kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null
  echo "nvml_max_MiB=$(sort -n "$smp" | tail -1)" >> "$out/swap_w64_resident.detail"
  return $rc
}
swap_capped() {
  local base=$out/swap_w64_resident/report.json
  [ -f "$base" ] || { echo "needs swap_w64_resident first"; return 1; }
  local fp cap nvml
  # A rank's footprint as the scheduler counts it: measured per process (NVML, as the resident run's sampler saw
  # it), else its peak tracked device bytes + --context-mem (512 MiB). Given as --rank-mem so ranks start by it
  # before they report memory (else the first ones start on a guess). The cap holds two such ranks, not three.
  nvml=$(sort -n "$out/swap_w64_resident.nvml" 2>/dev/null | tail -1)
  if [ -n "$nvml" ] && [ "$nvml" -gt 0 ] 2>/dev/null; then fp=$((nvml << 20))
  else fp=$(swap_json "$base" 'max(x.get("peak_memory_bytes") or 0 for x in r["ranks"]) + (512 << 20)'); fi
  cap=$((fp * 5 / 2))
  echo "rank_mem=$((fp >> 20))MiB gpu_mem_cap=$((cap >> 20))MiB" > "$out/swap_w64_capped.cap"
  swap_collect swap_w64_capped --gpu-mem-cap "$cap" --rank-mem "$fp" --swap-stall "${SWAP_STALL:-10}" || return 1
  cat "$out/swap_w64_capped.cap" >> "$out/swap_w64_capped.detail"
  echo "over_cap_notices=$(grep -c 'over the cap' "$out/swap_w64_capped.out") swap_failures_printed=$(grep -c 'swap: .* failed' "$out/swap_w64_capped.out")" >> "$out/swap_w64_capped.detail"
  local rep=$out/swap_w64_capped/report.json
  swap_json "$rep" '"swaps_out=%d swaps_in=%d moved_GiB=%.2f swap_s=%.1f peak_gpu_MiB=%d peak_host_MiB=%d failures=%d" % (r["swap"]["swaps_out"], r["swap"]["swaps_in"], (r["swap"]["bytes_out"] + r["swap"]["bytes_in"]) / 2**30, r["swap"]["seconds_out"] + r["swap"]["seconds_in"], r["swap"]["peak_gpu_bytes"] >> 20, r["swap"]["peak_host_bytes"] >> 20, r["swap"]["failures"])' >> "$out/swap_w64_capped.detail"
  grep -h "prism collect: context switching" "$out/swap_w64_capped.out" | tail -1 >> "$out/swap_w64_capped.detail"
  # Not a failure, reported: the GPU peak above the cap (ranks grow between their start and their first exchange,
  # and torch's new_group store barriers need every real rank started; docs/collect.md "Context switching").
  swap_json "$rep" '"peak_within_cap=%s" % (r["swap"]["peak_gpu_bytes"] <= r["swap"]["gpu_cap_bytes"])' >> "$out/swap_w64_capped.detail"
  swap_json "$rep" 'r["swap"]["swaps_out"] > 0 and r["swap"]["failures"] == 0 and r["swap"]["finished"] == 4' | grep -q True
}
swap_same_graph() {
  local a=$out/swap_w64_resident b=$out/swap_w64_capped
  for d in "$a" "$b"; do
    "$PRISM_RUN" graph build "$d" --out "$d/observed.json" --quiet || { echo "graph build $d failed"; return 1; }
    "$PRISM_RUN" simulate "$d/observed.prism" --out "$d/simulate" > "$d.simulate.log" 2>&1 || { echo "simulate $d failed"; tail -5 "$d.simulate.log"; return 1; }
  done
  $PYTHON - "$a/observed.json" "$b/observed.json" <<'PY' > "$out/swap_w64_same_graph.detail"
import json, sys
# Timing differs between the runs (the capped run's gaps hold swaps), and a gap of zero or less leaves no compute
# node, so compute nodes are counted, not compared. Communication must be the same: every class's streams with their
# communication nodes in order (kind, op, comm slot, bytes, dtype, peer, root), the communicators, rank -> class.
def comm_nodes(t):
    out = {}
    for c in t["classes"]:
        for st in c["streams"]:
            out[(c.get("name"), st.get("name"))] = [
                tuple(n.get(k) for k in ("kind", "op", "comm", "bytes", "dtype", "peer", "root"))
                for n in st["nodes"] if n.get("kind") != "compute"]
    return out
def compute_count(t):
    return sum(1 for c in t["classes"] for st in c["streams"] for n in st["nodes"] if n.get("kind") == "compute")
a, b = (json.load(open(p)) for p in sys.argv[1:3])
ca, cb = comm_nodes(a), comm_nodes(b)
print("comm_nodes resident=%d capped=%d compute_nodes %d/%d comms %d/%d" % (
    sum(map(len, ca.values())), sum(map(len, cb.values())), compute_count(a), compute_count(b),
    len(a.get("comms", [])), len(b.get("comms", []))))
ok = True
if ca != cb:
    ok = False
    for k in sorted(set(ca) | set(cb), key=str):
        if ca.get(k) != cb.get(k):
            print("differs: class/stream %s (%s vs %s nodes)" % (k, len(ca.get(k, [])), len(cb.get(k, []))))
for k in ("comms", "rank_class", "world_size", "layout"):
    if a.get(k) != b.get(k):
        ok = False
        print("differs: %s" % k)
print("same graph" if ok else "NOT the same graph")
sys.exit(0 if ok else 1)
PY
}
# swap_big (issue 7, item 2; not in the default cases): distinct ranks that together do not fit in the GPU. GPT of
# SWAP_BIG_LAYERS (24) layers, hidden 4096 (about 5 B parameters), tp 2 x pp 4, world 64: replica 0 is 8 ranks of
# about 0.6 B parameters, ~16-22 GiB each as NVML counts them (Adam and fp32 main parameters, 18 bytes per
# parameter, activations of up to 4 micro-batches in flight, the 1.3 GiB context): ~150 GiB together against the cap
# of 132.8 GiB (the H200's 139.8 GiB less 5 %), so that seven fit and each collective of the whole replica costs one
# swap out and one in. Collected with --swap and the default cap, SWAP_BIG_ITERS (1) iterations; the detail has the
# time, the swaps and the volume. Host RAM: the swapped-out ranks must fit in the host budget (80 % of MemAvailable).
# Why not 44 layers (the first sizing): its ranks grew to 22-34 GiB each, ~240 GiB together, more than the cap and the
# host budget hold together. Why not 28 (the second): 17-25 GiB each, five fit; each of the ~8 collectives of the
# whole replica in the optimizer step cost 2-3 swaps of ~15 s, and before the victim rule (docs/collect.md "No
# deadlock") the run did not finish its first iteration (docs/results/collect.md). SWAP_BIG_RANK_MEM (16G):
# --rank-mem, the footprint assumed before a rank reports memory, so that the 8 ranks start together (8 x 16G fit)
# instead of one at a time (~20 s each, 165 s in that run); they report ~1.3 GiB at start and grow at the first step.
swap_big() {
  local name=swap_big_pp4tp2 dir=$out/swap_big_pp4tp2
  local -a model=(--num-layers "${SWAP_BIG_LAYERS:-24}" --hidden-size 4096 --num-attention-heads 32 --seq-length 1024
    --max-position-embeddings 1024 --micro-batch-size 1 --log-interval 1 --eval-iters 1 --eval-interval 1000
    --mock-data --tokenizer-type NullTokenizer --vocab-size 32000 --transformer-impl local --lr 1e-4 --bf16
    --no-gradient-accumulation-fusion --disable-gloo-process-groups --no-persist-layer-norm --no-masked-softmax-fusion)
  (cd "$MEGATRON" && timeout -s INT -k 20 "${SWAP_BIG_TIMEOUT:-540}" "$PRISM_RUN" collect --out "$dir" --no-payloads --swap on \
     --rank-mem "${SWAP_BIG_RANK_MEM:-16G}" \
     torchrun --nnodes 8 --nproc-per-node 8 pretrain_gpt.py "${model[@]}" --tensor-model-parallel-size 2 \
     --pipeline-model-parallel-size 4 --global-batch-size 32 --train-iters "${SWAP_BIG_ITERS:-1}") > "$out/$name.out" 2>&1 \
     || { echo "collect exit $?"; grep -v '^\[rank' "$out/$name.out" | tail -30; return 1; }
  local rep=$dir/report.json
  [ -f "$rep" ] || { echo "no report.json"; return 1; }
  swap_json "$rep" '"wall_s=%.0f iterations=%s peak_GiB=%s swaps_out=%d swaps_in=%d moved_GiB=%.1f swap_s=%.1f peak_gpu_GiB=%.1f cap_GiB=%.1f peak_host_GiB=%.1f failures=%d" % (r["wall_s"], r["iterations"], [round((x.get("peak_memory_bytes") or 0)/2**30, 1) for x in r["ranks"]], r["swap"]["swaps_out"], r["swap"]["swaps_in"], (r["swap"]["bytes_out"] + r["swap"]["bytes_in"]) / 2**30, r["swap"]["seconds_out"] + r["swap"]["seconds_in"], r["swap"]["peak_gpu_bytes"] / 2**30, r["swap"]["gpu_cap_bytes"] / 2**30, r["swap"]["peak_host_bytes"] / 2**30, r["swap"]["failures"])' > "$out/$name.detail"
  [ -f "$dir/observed.prism" ] || { echo "no observed.prism"; return 1; }
  "$PRISM_RUN" simulate "$dir/observed.prism" --out "$dir/simulate" > "$out/$name.simulate.log" 2>&1 || { echo "simulate failed"; return 1; }
  swap_json "$rep" 'r["swap"]["swaps_out"] > 0 and r["swap"]["failures"] == 0 and r["swap"]["finished"] == 8' | grep -q True
}
for c in ${SWAP_CASES:-resident capped same_graph}; do
  case $c in
    resident) check swap_w64_resident swap_resident ;;
    capped) check swap_w64_capped swap_capped ;;
    same_graph) check swap_w64_same_graph swap_same_graph ;;
    big) check swap_big_pp4tp2 swap_big ;;
  esac
done
if [ "${swap_standalone:-0}" = 1 ]; then
  echo; echo "== swap suite"; cat "$table"
  ! grep -q ' FAIL ' "$table"
fi
