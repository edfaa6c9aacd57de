# Sourced by tests/gpu/run.sh: unmodified Megatron-LM under prism-run (issue 6's definition of done).
# Needs third_party/megatron (carried) and a build with prism-run and libprism.so.
source tests/gpu/megatron_env.sh
repo=$PWD
json_get() {  # json_get FILE EXPR  (EXPR in Python over `r`, the parsed report)
  $PYTHON -c "import json,sys; r=json.load(open(sys.argv[1])); print($2)" "$1"
}
# prism_megatron NAME RANKS NNODES TP PP GBS [extra megatron args...]
prism_megatron() {
  local name=$1 ranks=$2 nnodes=$3 tp=$4 pp=$5 gbs=$6; shift 6
  local dir=$out/$name
  # PRISM_ARGS: extra prism-run options (e.g. --payload recorded --payload-dir DIR)
  (cd "$MEGATRON" && timeout -s INT -k 20 "${MEGATRON_TIMEOUT:-300}" "$PRISM_RUN" ${PRISM_ARGS:-} --ranks "$ranks" --out "$dir" \
     torchrun --nnodes "$nnodes" --nproc-per-node 8 pretrain_gpt.py "${MEGATRON_TINY_ARGS[@]}" \
     --tensor-model-parallel-size "$tp" --pipeline-model-parallel-size "$pp" --global-batch-size "$gbs" \
     --train-iters 10 "$@")
}
megatron_check() {  # NAME RANKS NNODES TP PP GBS [args]: trains 10 iterations, report written, finite loss where printed
  local name=$1
  mkdir -p "$out/$name"
  prism_megatron "$@" || { echo "prism-run exit $?"; return 1; }
  local rep=$out/$name/report.json
  [ -f "$rep" ] || { echo "no report.json"; return 1; }
  json_get "$rep" '"iterations=%s iter_s=%.4f peak_MiB=%s wall_s=%.1f" % (r["iterations"], r["iteration_time_s"] or 0, [round((x.get("peak_memory_bytes") or 0)/2**20,1) for x in r["ranks"]], r["wall_s"])' > "$out/$name.detail"
  local iters; iters=$(json_get "$rep" 'r["iterations"]')
  [ "$iters" -ge 9 ] || { echo "only $iters iterations"; return 1; }
  # The last pipeline stage prints the loss: it must be finite wherever it is printed.
  if grep -h "lm loss:" "$out/$name"/logs/*.log > "$out/$name.loss" 2>/dev/null; then
    ! grep -qiE "lm loss: (nan|inf)" "$out/$name.loss" || { echo "non-finite loss"; return 1; }
    echo "loss=$(tail -1 "$out/$name.loss" | sed -E 's/.*lm loss: ([0-9.E+-]+).*/\1/')" >> "$out/$name.detail"
  fi
}
# collect (issue 7) and fill (issue 8) take their job's shape from FILL_SHAPE:
#   w64      world 64 (8 x 8), tp 2, pp 2, global batch 64 (2 micro-batches per replica), 10 iterations (default)
#   w128pp4  world 128 (16 x 8), tp 2, pp 4, global batch 256 (8 micro-batches: a large 1F1B bubble), 10 iterations
#   w64pp4   world 64 (8 x 8), tp 1, pp 4, global batch 256 (8 micro-batches per replica), 10 iterations: 4 classes
fill_shape() {
  shape_tp=2
  case ${FILL_SHAPE:-w64} in
    w64) shape_tag=w64 shape_nnodes=8 shape_pp=2 shape_gbs=64 ;;
    w128pp4) shape_tag=w128pp4 shape_nnodes=16 shape_pp=4 shape_gbs=256 ;;
    w64pp4) shape_tag=w64pp4 shape_nnodes=8 shape_pp=4 shape_gbs=256 shape_tp=1 ;;
    *) echo "unknown FILL_SHAPE ${FILL_SHAPE}"; return 1 ;;
  esac
  # FILL_GBS: another global batch (with FIDELITY_MBS, megatron_env.sh: a larger micro-batch keeps the micro-batch
  # count, e.g. FIDELITY_MBS=8 FILL_GBS=256 for the medium model's GPU-bound variant).
  shape_gbs=${FILL_GBS:-$shape_gbs}
  # FILL_MODEL=medium: the fidelity suite's GPU-bound model (megatron_env.sh), whose iterations vary less than the
  # tiny model's 8-12 % (docs/fill.md: one run of the tiny model cannot resolve the 2 % target); directories get
  # a "_medium" suffix.
  local -a model=("${MEGATRON_TINY_ARGS[@]}")
  if [ "${FILL_MODEL:-tiny}" = medium ]; then model=("${MEGATRON_MEDIUM_ARGS[@]}"); shape_tag+=_medium; fi
  # Why: Megatron wants the layers divisible by the stages (the tiny model has 2; the last --num-layers wins).
  if [ "${FILL_MODEL:-tiny}" = tiny ] && [ "$shape_pp" -gt 2 ]; then model+=(--num-layers "$shape_pp"); fi
  shape_job=(torchrun --nnodes "$shape_nnodes" --nproc-per-node 8 pretrain_gpt.py "${model[@]}"
    --tensor-model-parallel-size "$shape_tp" --pipeline-model-parallel-size "$shape_pp" --global-batch-size "$shape_gbs"
    --train-iters 10)
  # Replica 0's ranks: tp 0/1 of every stage (a stage is world / pp ranks apart in Megatron's default order).
  local st=$((shape_nnodes * 8 / shape_pp)) p
  shape_replica=()
  for ((p = 0; p < shape_pp; p++)); do
    shape_replica+=($((p * st)))
    [ "$shape_tp" -gt 1 ] && shape_replica+=($((p * st + 1)))
  done
  shape_last=$(((shape_pp - 1) * st + shape_tp - 1))
}
# collect: data-parallel replica 0 on the one GPU, real data between its ranks; then (w64r63rec) rank 63 replays
# rank 33's recorded payloads.
megatron_collect() {
  fill_shape || return 1
  local name=megatron_${shape_tag}_collect dir=$out/megatron_${shape_tag}_collect
  (cd "$MEGATRON" && timeout -s INT -k 20 "${MEGATRON_TIMEOUT:-400}" "$PRISM_RUN" collect --out "$dir" \
     "${shape_job[@]}") > "$out/$name.out" 2>&1 || { echo "collect exit $?"; tail -20 "$out/$name.out"; return 1; }
  local rep=$dir/report.json
  json_get "$rep" '"iterations=%s iter_s=%.4f ranks=%s" % (r["iterations"], r["iteration_time_s"] or 0, [x["rank"] for x in r["ranks"]])' > "$out/$name.detail"
  echo "payload_MiB=$(du -sm "$dir/payloads" | cut -f1) graph=$([ -f "$dir/observed.prism" ] && echo yes || echo no)" >> "$out/$name.detail"
  grep -h "lm loss:" "$dir"/logs/*.log | tail -1 | sed -E 's/.*lm loss: ([0-9.E+-]+).*/loss=\1/' >> "$out/$name.detail"
  [ "$(json_get "$rep" 'r["iterations"]')" -ge 9 ] || return 1
  for r in "${shape_replica[@]}"; do [ -s "$dir/payloads/rank$r.bin" ] || { echo "no payloads for rank $r"; return 1; }; done
  [ -f "$dir/observed.prism" ] || { echo "no observed.prism"; grep -i "observed\|graph\|class" "$out/$name.out" | tail -5; return 1; }
  "$PRISM_RUN" simulate "$dir/observed.prism" --out "$dir/simulate" > "$out/$name.simulate.log" 2>&1 || true
}
# Start-up at scale through prism-run and the coordinator (issue 5): plain torch (tests/gpu/shim_torch_ops.py, every
# call Megatron uses) as rank 5 of a world of NNODES x 8; the coordinator is the store and stands in for every
# virtual rank and group leader.
ops_prism() {  # NAME NNODES
  local name=$1 nnodes=$2
  (SHIM_OWN_STORE=0 timeout -s INT -k 20 300 "$PRISM_RUN" --ranks 5 --out "$out/$name" torchrun --nnodes "$nnodes" \
     --nproc-per-node 8 tests/gpu/shim_torch_ops.py) > "$out/$name.out" 2>&1
  local rc=$? log=$out/$name/logs/rank5.log
  local init ops
  init=$(grep -oh "init_process_group_s=[0-9.]*" "$log" | tail -1)
  ops=$(grep -h "^TORCH_OPS" "$log" | tail -1)
  echo "$init ${ops#TORCH_OPS } prism_wall_s=$(json_get "$out/$name/report.json" 'round(r["wall_s"],1)' 2>/dev/null)" > "$out/$name.detail"
  [ $rc -eq 0 ] && [[ "$ops" == *PASS* ]]
}
# fill (issue 8): from the collect run above, each class alone (FILL_GPUS=G > 1: each tensor-parallel group, on G
# GPUs, on the real NCCL) against the others replayed from the graph; then
# the first and last stage's tp-0 ranks (FILL_EMULATE_RANKS, default 0 and the last stage's) emulated with the
# filled graph: the report compares each with simulate of the graph iteration by iteration (graph_comparison);
# then rank 0 with the mirror policy and no graph (which cannot see the pipeline bubble), and rank 0 with
# FILL_WHATIF (default straggler=<rank 0's next-stage peer>:1.14) against `simulate --what-if` of the same graph.
# The emulated iteration time and the pipeline wait per iteration (report.json wait_per_iteration_s): the bubble.
# Also the coordinator's latency per iteration (gates opened after their decided release, from the op lines'
# opened_ns: docs/libprism.md): "-" where the run's event lines do not carry it.
pp_wait_expr='"emulated %.2f ms, pipeline wait %.2f ms/iter, coordinator latency %s ms/iter" % (1e3*(r["iteration_time_s"] or 0), 1e3*(r["ranks"][0].get("wait_per_iteration_s") or {}).get("PIPELINE_MODEL_PARALLEL_GROUP", 0), ("%.2f" % (1e3*r["ranks"][0]["coordinator_latency_per_iteration_s"])) if r["ranks"][0].get("coordinator_latency_per_iteration_s") is not None else "-")'
megatron_fill() {
  fill_shape || return 1
  local name=megatron_${shape_tag}_fill dir=$out/megatron_${shape_tag}_fill col=$out/megatron_${shape_tag}_collect
  [ -f "$col/report.json" ] || { echo "needs the collect case first"; return 1; }
  (cd "$MEGATRON" && timeout -s INT -k 20 "${FILL_TIMEOUT:-420}" "$PRISM_RUN" fill --from "$col" --out "$dir" \
     --rounds "${FILL_ROUNDS:-2}" --gpus "${FILL_GPUS:-1}" "${shape_job[@]}") > "$out/$name.out" 2>&1 || { echo "fill exit $?"; tail -20 "$out/$name.out"; return 1; }
  grep "prism fill: estimate" "$out/$name.out" | sed 's/prism fill: //' > "$out/$name.detail"
  json_get "$dir/fill.json" '"simulate(filled) %.2f ms" % (1e3*r["calibrated_iteration_time_s"])' >> "$out/$name.detail"
  local r ok=0 peer=$((shape_nnodes * 8 / shape_pp))
  for r in ${FILL_EMULATE_RANKS:-0 $((shape_last - 1))}; do
    (cd "$MEGATRON" && timeout -s INT -k 20 200 "$PRISM_RUN" --ranks "$r" --graph "$dir/filled.prism" \
       --payload recorded --payload-dir "$col" --out "$dir/emulate_rank$r" "${shape_job[@]}") > "$out/$name.rank$r.out" 2>&1 \
       || { echo "emulate rank $r with the graph: exit $?"; ok=1; continue; }
    echo "rank$r: $(json_get "$dir/emulate_rank$r/report.json" "$pp_wait_expr")" \
      "graph blocked $(grep -c 'blocked on a real rank' "$out/$name.rank$r.out") unmatched $(grep -c 'does not match the graph' "$out/$name.rank$r.out");" \
      "$(grep -h 'emulated vs simulate(graph)' "$out/$name.rank$r.out" | head -1)" >> "$out/$name.detail"
    grep -q 'emulated vs simulate(graph)' "$out/$name.rank$r.out" || ok=1
  done
  if [ "${FILL_CONTRAST:-1}" = 1 ]; then megatron_fill_contrast >> "$out/$name.detail" || ok=1; fi
  return $ok
}
# The fill's contrast runs (also a case of their own, "contrast", over a fill directory left by an earlier call on
# the same machine): rank 0 under the mirror policy without a graph, and rank 0 with FILL_WHATIF against the graph.
megatron_fill_contrast() {
  fill_shape || return 1
  local dir=$out/megatron_${shape_tag}_fill col=$out/megatron_${shape_tag}_collect ok=0
  local name=megatron_${shape_tag}_fill peer=$((shape_nnodes * 8 / shape_pp))
  [ -f "$dir/filled.prism" ] || { echo "needs the fill case first ($dir/filled.prism)"; return 1; }
  if [ "${FILL_MIRROR:-1}" = 1 ]; then
    (cd "$MEGATRON" && timeout -s INT -k 20 200 "$PRISM_RUN" --ranks 0 --payload recorded --payload-dir "$col" \
       --out "$dir/mirror_rank0" "${shape_job[@]}") > "$out/$name.mirror0.out" 2>&1 || { echo "mirror rank 0: exit $?" >&2; ok=1; }
    echo "rank0 mirror (no graph): $(json_get "$dir/mirror_rank0/report.json" "$pp_wait_expr")" 
  fi
  local what=${FILL_WHATIF:-straggler=$peer:1.14}
  if [ "$what" != none ]; then
    (cd "$MEGATRON" && timeout -s INT -k 20 200 "$PRISM_RUN" --ranks 0 --graph "$dir/filled.prism" --what-if "$what" \
       --payload recorded --payload-dir "$col" --out "$dir/whatif_rank0" "${shape_job[@]}") > "$out/$name.whatif0.out" 2>&1 \
       || { echo "what-if rank 0: exit $?" >&2; ok=1; }
    echo "rank0 --what-if $what: $(grep -h 'emulated vs simulate(graph)' "$out/$name.whatif0.out" | head -1)" 
  fi
  return $ok
}
# moe (issue 7, --real-routing): a tiny MoE GPT (4 experts, top-2, all-to-all dispatch), world 16 (2 x 8), tp 1,
# pp 2, ep 2, collected twice on the one GPU: without --real-routing (replica 0: ranks 0 and 8; the graph's ep-1
# classes borrow the ep-0 ranks' nodes, EP symmetry assumed) and with it (ranks 0, 1, 8, 9: every class its own). Both
# must write observed.prism with 4 classes and simulate it; the detail has the real ranks, the borrowed classes and
# both simulated iteration times (MOE_MODES="plain routing" by default; MOE_ITERS 5). --disable-bias-linear: Megatron's MoE experts apply the router's probabilities in a
# weighted SwiGLU fusion that refuses a bias (it raises NotImplementedError). After the routing collect,
# rank MOE_GRAPH_RANK (default 0; none: skip) runs against its graph with its expert-parallel peers virtual
# (docs/collect.md, "--real-routing": its all-to-all's copies to itself are not numbered, so its releases follow the graph):
# the detail gets its "emulated vs simulate(graph)" and "graph replay" lines (0 blocked, 0 unmatched expected).
megatron_moe_collect() {
  local name=megatron_w16_moe_collect ok=0 mode
  local -a job=(torchrun --nnodes 2 --nproc-per-node 8 pretrain_gpt.py "${MEGATRON_TINY_ARGS[@]}"
    --num-experts 4 --moe-router-topk 2 --moe-token-dispatcher-type alltoall --swiglu --disable-bias-linear
    --tensor-model-parallel-size 1 --pipeline-model-parallel-size 2 --expert-model-parallel-size 2
    --global-batch-size 16 --train-iters "${MOE_ITERS:-5}")
  : > "$out/$name.detail"
  for mode in ${MOE_MODES:-plain routing}; do
    local dir=$out/${name}_$mode
    local -a extra=(); [ "$mode" = routing ] && extra=(--real-routing)
    (cd "$MEGATRON" && timeout -s INT -k 20 "${MEGATRON_TIMEOUT:-300}" "$PRISM_RUN" collect --out "$dir" "${extra[@]}" \
       "${job[@]}") > "$out/$name.$mode.out" 2>&1 || { echo "$mode: collect exit $?" >> "$out/$name.detail"; ok=1; continue; }
    if [ ! -f "$dir/observed.prism" ]; then
      echo "$mode: no observed.prism ($(grep -h 'observed' "$out/$name.$mode.out" | tail -1))" >> "$out/$name.detail"; ok=1; continue
    fi
    "$PRISM_RUN" simulate "$dir/observed.prism" --out "$dir/simulate" > "$out/$name.$mode.simulate.log" 2>&1 \
      || { echo "$mode: simulate failed" >> "$out/$name.detail"; ok=1; continue; }
    echo "$mode: $(json_get "$dir/report.json" '"ranks %s, %s iterations, %.1f ms/iteration" % ([x["rank"] for x in r["ranks"]], r["iterations"], 1e3 * (r["iteration_time_s"] or 0))');" \
      "$(grep -h 'observed graph\|mirrored\|borrow' "$out/$name.$mode.out" | grep -v '^\[' | tail -2 | tr '\n' ' ')" \
      "simulate $(json_get "$dir/simulate/report.json" '"%.2f ms" % (1e3 * r["iteration_time_s"])' 2>/dev/null)" >> "$out/$name.detail"
    local gr=${MOE_GRAPH_RANK:-0}
    if [ "$mode" = routing ] && [ "$gr" != none ]; then
      (cd "$MEGATRON" && timeout -s INT -k 20 "${MEGATRON_TIMEOUT:-300}" "$PRISM_RUN" --ranks "$gr" \
         --graph "$dir/observed.prism" --out "${dir}_graph_rank$gr" "${job[@]}") > "$out/$name.graph$gr.out" 2>&1 \
        || { echo "routing: --graph rank $gr exit $?" >> "$out/$name.detail"; ok=1; continue; }
      echo "routing --graph rank $gr: $(grep -h 'emulated vs simulate(graph)\|graph replay:' "$out/$name.graph$gr.out" \
        | tr '\n' ' ')" >> "$out/$name.detail"
    fi
  done
  return $ok
}
# default (issue 23): the one command a user types, `prism-run --ranks 0 torchrun ...` with no policy option, twice
# with one graph cache: the first run collects, fills (until 0.5 %, at most 4 rounds) and emulates rank 0 against the
# filled graph; the second hits the cache and starts the real rank at once. DEFAULT_SHAPE: w64 (FILL_MODEL=medium for
# the GPU-bound model), w128pp4 (the 4-stage bubble), moe (tiny MoE tp1 pp2 ep2: real routing; rank 0's max
# allocated against the collect's rank 0). The detail: each stage's wall time, the fill's rounds and last move, rank 0
# against simulate of the filled graph (graph_comparison), its pipeline wait, the second run's hit and the seconds
# from its start to "rank 0 started". DEFAULT_ARGS: more prism-run options for both runs (a comma for a space, e.g.
# --fill-rounds,1); DEFAULT_RUNS=1 runs the first only. PASS: the second run (when run) a hit that started rank 0 within 60 s, and per shape: w64 the fill converged
# and |steady median error| <= 2 %; w128pp4 and w64pp4 the pipeline wait is over 10 % of rank 0's iteration (the bubble); moe
# max allocated equal to the MB.
default_expr='"iter %.2f ms; pp wait %.2f ms/it; fill %s after %s round(s), last move %.2f %%; stages %s; vs simulate(graph) median %s %%, steady medians %s %%, steady total %s %%" % (1e3*(r["iteration_time_s"] or 0), 1e3*(r["ranks"][0].get("wait_per_iteration_s") or {}).get("PIPELINE_MODEL_PARALLEL_GROUP", 0), "converged" if r["fill"]["converged"] else "NOT converged", r["fill"]["rounds"], r["fill"]["last_moved_pct"], " ".join("%s=%.0fs%s" % (s["name"], s["wall_s"], " (built in %.0fs)" % s["built_s"] if "built_s" in s else "") for s in r["stages"]), *[("%+.2f" % g[k]) if g else "-" for g in [(r.get("graph_comparison") or {}).get("ranks", [None])[0]] for k in ("median_error_pct", "steady_median_error_pct", "steady_total_error_pct")])'
stamp_lines() { while IFS= read -r l; do printf '%s %s\n' "$EPOCHREALTIME" "$l"; done; }
megatron_default() {
  local -a job
  case ${DEFAULT_SHAPE:-w64} in
    moe) shape_tag=w16_moe
         job=(torchrun --nnodes 2 --nproc-per-node 8 pretrain_gpt.py "${MEGATRON_TINY_ARGS[@]}"
           --num-experts 4 --moe-router-topk 2 --moe-token-dispatcher-type alltoall --swiglu --disable-bias-linear
           --tensor-model-parallel-size 1 --pipeline-model-parallel-size 2 --expert-model-parallel-size 2
           --global-batch-size 16 --train-iters 10) ;;
    *) FILL_SHAPE=${DEFAULT_SHAPE:-w64} fill_shape || return 1; job=("${shape_job[@]}") ;;
  esac
  local name=megatron_${shape_tag}_default dir=$out/megatron_${shape_tag}_default cache=$out/graph-cache
  mkdir -p "$dir"
  # MEM_SNAPSHOT=1: torch's allocation history on in every real rank (tests/gpu/mem_history.py), Megatron dumping
  # snapshots; each new version of rank 0's is copied aside with its time and read by tests/gpu/mem_snapshot.py
  # after the runs (which peak, which tensors live at it), so a stage's peak can be told from another's.
  local snap=$dir/snap poll_pid= gpu_dir=$PWD/tests/gpu
  if [ "${MEM_SNAPSHOT:-}" = 1 ]; then
    mkdir -p "$snap/seen"
    local i
    for i in "${!job[@]}"; do [[ "${job[$i]}" == pretrain_gpt.py ]] && break; done
    job=("${job[@]:0:$i}" "$gpu_dir/mem_history.py" "${job[@]:$i}" --record-memory-history
      --memory-snapshot-path "$snap/mem.pickle")
    ( last=; while sleep 1; do
        m=$(stat -c %Y.%s "$snap/mem_0.pickle" 2>/dev/null) || continue
        [ "$m" = "$last" ] && continue
        sleep 1; last=$(stat -c %Y.%s "$snap/mem_0.pickle" 2>/dev/null)
        cp "$snap/mem_0.pickle" "$snap/seen/mem_0.$EPOCHSECONDS.pickle" 2>/dev/null
      done ) &
    poll_pid=$!
  fi
  local t0=$EPOCHREALTIME run
  local -a extra
  local da=${DEFAULT_ARGS:-}; read -r -a extra <<< "${da//,/ }"
  for run in $(seq 1 "${DEFAULT_RUNS:-2}"); do
    (cd "$MEGATRON" && env -u PRISM_POLICY timeout -s INT -k 20 "${DEFAULT_TIMEOUT:-480}" "$PRISM_RUN" --ranks 0 \
       --graph-cache "$cache" --quiet --out "$dir/run$run" "${extra[@]}" "${job[@]}") 2>&1 |
      stamp_lines > "$out/$name.run$run.out"
    [ -f "$dir/run$run/report.json" ] || { echo "run $run: no report.json"; tail -20 "$out/$name.run$run.out"; return 1; }
  done
  local r1=$dir/run1/report.json r2=$dir/run2/report.json ok=0
  echo "run1: $(json_get "$r1" "$default_expr")" > "$out/$name.detail"
  if [ -n "$poll_pid" ]; then
    kill "$poll_pid" 2>/dev/null
    grep -h "prism: stage\|prism: collect\|prism: fill\|prism: emulat" "$out/$name".run*.out | head -40 > "$out/$name.stages"
    "$PYTHON" "$gpu_dir/mem_snapshot.py" "$snap"/seen/*.pickle > "$out/$name.snapshots" 2>&1
    rm -rf "$snap"
  fi
  if [ "${DEFAULT_RUNS:-2}" -ge 2 ]; then
    local start2 first2
    start2=$(head -1 "$out/$name.run2.out" | cut -d' ' -f1)
    first2=$(grep -m1 'prism: rank 0 started' "$out/$name.run2.out" | cut -d' ' -f1)
    echo "run2: cache $(json_get "$r2" '"hit" if r["graph_cache"]["hit"] else "MISS"'), rank 0 started $($PYTHON -c "import sys; print('%.1f' % (float(sys.argv[2]) - float(sys.argv[1])))" "$start2" "${first2:-0}") s after prism-run's first line; $(json_get "$r2" "$default_expr")" >> "$out/$name.detail"
    json_get "$r2" 'r["graph_cache"]["hit"]' | grep -q True || ok=1
    $PYTHON -c "import sys; sys.exit(0 if 0 < float(sys.argv[2]) - float(sys.argv[1]) < 60 else 1)" "$start2" "${first2:-0}" || ok=1
  fi
  if [ "${DEFAULT_SHAPE:-w64}" = moe ]; then
    local col; col=$(json_get "$r1" 'r["graph_cache"]["dir"]')/collect
    local a b
    a=$(grep -ohE "max allocated: [0-9.]+" "$col"/logs/rank0.log | tail -1 | awk '{print $3}')
    b=$(grep -ohE "max allocated: [0-9.]+" "$dir"/run1/logs/rank0.log | tail -1 | awk '{print $3}')
    echo "moe rank 0 max allocated: collect (real routing) ${a:-?} MB, default ${b:-?} MB" >> "$out/$name.detail"
    [ -n "$a" ] && [ "$a" = "$b" ] || ok=1
  elif [[ "${DEFAULT_SHAPE:-w64}" == *pp4 ]]; then
    json_get "$r1" '(r["ranks"][0].get("wait_per_iteration_s") or {}).get("PIPELINE_MODEL_PARALLEL_GROUP", 0) > 0.1 * r["iteration_time_s"]' |
      grep -q True || ok=1
  else
    json_get "$r1" 'r["fill"]["converged"]' | grep -q True || ok=1
    json_get "$r1" 'abs(r["graph_comparison"]["ranks"][0]["steady_median_error_pct"]) <= 2' | grep -q True || ok=1
  fi
  return $ok
}
megatron_fill_contrast_case() { megatron_fill_contrast > "$out/megatron_${shape_tag}_fill_contrast.detail"; }
megatron_cases=${MEGATRON_CASES:-w64r0 w64r63 w64r01 w1024r0 mem}
for c in $megatron_cases; do
  case $c in
    w64r0) check megatron_w64_tp2pp2_rank0 megatron_check megatron_w64_tp2pp2_rank0 0 8 2 2 64 ;;
    w64r63) check megatron_w64_tp2pp2_rank63 megatron_check megatron_w64_tp2pp2_rank63 63 8 2 2 64 ;;
    w64r01) check megatron_w64_tp2pp2_ranks01 megatron_check megatron_w64_tp2pp2_ranks01 0,1 8 2 2 64 ;;
    w1024r0) check megatron_w1024_tp2pp2_rank0 megatron_check megatron_w1024_tp2pp2_rank0 0 128 2 2 512 ;;
    collect) fill_shape && check "megatron_${shape_tag}_collect" megatron_collect ;;
    fill) fill_shape && check "megatron_${shape_tag}_fill" megatron_fill ;;
    contrast) fill_shape && check "megatron_${shape_tag}_fill_contrast" megatron_fill_contrast_case ;;
    moe) check megatron_w16_moe_collect megatron_moe_collect ;;
    default) check "megatron_${DEFAULT_SHAPE:-w64}${FILL_MODEL:+_$FILL_MODEL}_default" megatron_default ;;
    ops1024) check torch_ops_prism_w1024_rank5 ops_prism torch_ops_prism_w1024_rank5 128 ;;
    ops8192) check torch_ops_prism_w8192_rank5 ops_prism torch_ops_prism_w8192_rank5 1024 ;;
    w64r63rec) PRISM_ARGS="--payload recorded --payload-dir $out/megatron_w64_collect" \
                 check megatron_w64_tp2pp2_rank63_recorded megatron_check megatron_w64_tp2pp2_rank63_recorded 63 8 2 2 64 ;;
  esac
done

# Memory fidelity: the same rank natively (world 1, real NCCL) and under prism (world 1): torch's max allocated,
# with and without the distributed optimizer.
memory_world1() {  # NAME [megatron args]
  local name=$1; shift
  local native=$out/${name}_native.log
  (cd "$MEGATRON" && timeout 200 $PYTHON -m torch.distributed.run --nproc-per-node 1 pretrain_gpt.py \
     "${MEGATRON_TINY_ARGS[@]}" --global-batch-size 4 --train-iters 10 "$@") > "$native" 2>&1 || return 1
  mkdir -p "$out/${name}_prism"
  (cd "$MEGATRON" && timeout -s INT 200 "$PRISM_RUN" --ranks 0 --out "$out/${name}_prism" torchrun --nproc-per-node 1 \
     pretrain_gpt.py "${MEGATRON_TINY_ARGS[@]}" --global-batch-size 4 --train-iters 10 "$@") || return 1
  local a b
  a=$(grep -oE "max allocated: [0-9.]+" "$native" | tail -1 | awk '{print $3}')
  b=$(grep -ohE "max allocated: [0-9.]+" "$out/${name}_prism"/logs/*.log | tail -1 | awk '{print $3}')
  echo "native_max_alloc_MB=$a prism_max_alloc_MB=$b" > "$out/$name.detail"
  $PYTHON -c "import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); sys.exit(0 if abs(a-b)<=0.01*a else 1)" "$a" "$b"
}
# Why a warm-up: the first Megatron run on a fresh machine compiles its fused kernels and peaks ~43 MB higher
# (158.6 vs 115.05 MB max allocated, measured); both sides of the comparison must run warm.
memory_warmup() {
  (cd "$MEGATRON" && timeout 200 $PYTHON -m torch.distributed.run --nproc-per-node 1 pretrain_gpt.py \
     "${MEGATRON_TINY_ARGS[@]}" --global-batch-size 4 --train-iters 2) > "$out/memory_warmup.log" 2>&1
}
# The distributed optimizer's shard shrinks with dp: prism world 8 (dp 8) vs prism world 1, measured delta of
# torch's max allocated against the delta of Megatron's own "weight and optimizer" formula.
memory_dp_shard() {
  local d
  for w in 1 8; do
    d=$out/memory_dp_shard_w$w; mkdir -p "$d"
    (cd "$MEGATRON" && timeout -s INT 200 "$PRISM_RUN" --ranks 0 --out "$d" torchrun --nproc-per-node $w \
       pretrain_gpt.py "${MEGATRON_TINY_ARGS[@]}" --global-batch-size $((2 * w)) --train-iters 10 \
       --use-distributed-optimizer) > "$d.log" 2>&1 || return 1
  done
  $PYTHON - "$out" <<'PY' > "$out/memory_dp_shard.detail"
import re, sys, glob
out = sys.argv[1]
def grab(w):
    text = open(glob.glob(f"{out}/memory_dp_shard_w{w}/logs/rank0.log")[0]).read()
    alloc = float(re.findall(r"max allocated: ([0-9.]+)", text)[-1])
    theo = float(re.findall(r"weight and optimizer=([0-9.]+) MB", text)[-1])
    return alloc, theo
(a1, t1), (a8, t8) = grab(1), grab(8)
print(f"max_alloc_MB w1={a1} w8={a8} delta={a1-a8:.2f}; megatron_formula_MB w1={t1} w8={t8} delta={t1-t8:.2f}")
sys.exit(0 if abs((a1 - a8) - (t1 - t8)) <= max(1.0, 0.1 * abs(t1 - t8)) else 1)
PY
}
case " $megatron_cases " in *" mem "*)
  memory_warmup
  check memory_world1_native_vs_prism memory_world1 memory_world1_native_vs_prism
  check memory_world1_distopt_native_vs_prism memory_world1 memory_world1_distopt_native_vs_prism --use-distributed-optimizer ;;
esac
case " $megatron_cases " in *" dpshard "*) check memory_dp_shard memory_dp_shard ;; esac
