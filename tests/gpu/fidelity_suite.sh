# shellcheck shell=bash
# Fidelity against real multi-GPU runs (issue 10; docs/fidelity.md). Sourced by tests/gpu/run.sh:
#   tests/gpu/run.sh OUT fidelity
# Per configuration (tp2, pp2, ...): unmodified Megatron-LM natively on W GPUs, then prism-run with one real rank
# (0, and W - tp: the last pipeline stage and data-parallel replica), then with two (0,1), every other rank of the W
# virtual; the iteration-time and peak-memory error of each prism run against the native one. Logs under
# OUT/fidelity/<config>/<run>/; the table in OUT/fidelity.md and OUT/fidelity.tsv (tests/gpu/fidelity_table.py,
# which also reads several OUT/fidelity directories at once: runs split over several calls make one table).
# One check row per configuration (PASS: every run finished and its numbers were parsed; the errors are in the
# detail) and a last row fidelity_targets (PASS only when the targets are met).
#
# Environment:
#   FIDELITY_CASES      configurations (default: every one whose world fits this host's GPUs; on one GPU the 2-GPU
#                       ones, as a smoke test: native and two-rank runs are skipped, "needs 2 GPUs")
#   FIDELITY_RUNS       runs per configuration, default "native r0 rlast r01"
#   FIDELITY_GPUS       use only the first N GPUs (of CUDA_VISIBLE_DEVICES when set, else of nvidia-smi -L)
#   FIDELITY_ITERS (30), FIDELITY_SKIP (10: iterations left out of the medians), FIDELITY_T (300 s per run)
#   FIDELITY_LAYERS (8), FIDELITY_HIDDEN (2048), FIDELITY_HEADS (16), FIDELITY_SEQ (1024): the model
#   FIDELITY_LAST       tp0 (default): the second one-rank run is rank W - tp (tensor-parallel rank 0 of the last
#                       pipeline stage and data-parallel replica; skipped when that is rank 0, as in tp2 and tp4);
#                       last: rank W-1, with the payloads of a `prism-run collect` when its tensor-parallel rank is
#                       not 0 (large: every tensor-parallel all-reduce of every iteration is recorded)
#   FIDELITY_PAYLOAD    auto (default: recorded where the rank needs it, else mirror) | mirror | recorded
#   FIDELITY_TOPOLOGY   prism's cost-model topology: a preset name or a file (e.g. `prism-run calibrate`'s output);
#                       default: h200-8x400g with NVLS off (the native runs disable NVLS); "none": prism's default
#   FIDELITY_PRISM_ARGS extra prism-run options (split on spaces)
#   FIDELITY_WARMUP     1 (default): a 3-iteration native run before the first configuration of each kernel shape
#                       (tensor-parallel size, MoE or not), so that no measured run pays the first-run compile
#                       (megatron_suite.sh: a cold run peaked 43 MB higher)
: "${out:?sourced by tests/gpu/run.sh, which sets out, PRISM_RUN and check}"
# shellcheck source=tests/gpu/megatron_env.sh
source tests/gpu/megatron_env.sh

fid_root=$out/fidelity
fid_repo=$PWD
fid_py=$(command -v python3 || echo "$PYTHON")
fid_hook=$fid_root/hook
FIDELITY_ITERS=${FIDELITY_ITERS:-30}
FIDELITY_SKIP=${FIDELITY_SKIP:-10}
FIDELITY_T=${FIDELITY_T:-300}
FIDELITY_PAYLOAD=${FIDELITY_PAYLOAD:-auto}
FIDELITY_RUNS=${FIDELITY_RUNS:-native r0 rlast r01}
FID_MODEL_ARGS=("${MEGATRON_MEDIUM_ARGS[@]}")
# Why --swiglu: with --num-experts, Megatron fuses the bias activation with the router's per-token scale only for
# swiglu and quick_geglu (gelu raises "Only support fusion of swiglu and quick_gelu with per_token_scale", seen on the
# GPU machine).
FID_MOE_ARGS=(--moe-router-topk 2 --moe-token-dispatcher-type alltoall --swiglu)

# The GPUs of this host: CUDA_VISIBLE_DEVICES entries when set, else nvidia-smi -L (else torch), first FIDELITY_GPUS.
fid_detect_gpus() {
  local -a g=()
  local n i
  if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
    IFS=, read -ra g <<< "$CUDA_VISIBLE_DEVICES"
  else
    n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
    [[ "$n" =~ ^[1-9][0-9]*$ ]] || n=$("$PYTHON" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null)
    [[ "$n" =~ ^[0-9]+$ ]] || n=0
    for ((i = 0; i < n; i++)); do g+=("$i"); done
  fi
  [ -n "${FIDELITY_GPUS:-}" ] && g=("${g[@]:0:FIDELITY_GPUS}")
  if ((${#g[@]} == 0)); then
    echo "fidelity: no GPU found (nvidia-smi -L, torch); planning for GPU 0"
    g=(0)
  fi
  fid_gpus=("${g[@]}")
}
fid_devs() {  # N: the first N GPUs, comma-separated
  local IFS=,
  echo "${fid_gpus[*]:0:$1}"
}

# fid_spec NAME: the configuration's world (fid_w), tp, pp, ep and extra Megatron arguments (fid_extra)
fid_spec() {
  fid_tp=1 fid_pp=1 fid_ep=1 fid_extra=()
  case $1 in
    tp2) fid_w=2 fid_tp=2 ;;
    pp2) fid_w=2 fid_pp=2 ;;
    dp2) fid_w=2 ;;
    dp2_distopt_ovl) fid_w=2 fid_extra=(--use-distributed-optimizer --overlap-grad-reduce) ;;
    moe_ep2) fid_w=2 fid_ep=2 fid_extra=(--num-experts 4 "${FID_MOE_ARGS[@]}") ;;
    tp2pp2) fid_w=4 fid_tp=2 fid_pp=2 ;;
    tp4) fid_w=4 fid_tp=4 ;;
    moe_ep4) fid_w=4 fid_ep=4 fid_extra=(--num-experts 8 "${FID_MOE_ARGS[@]}") ;;
    tp2pp2dp2) fid_w=8 fid_tp=2 fid_pp=2 ;;
    tp2pp2dp2_ovl) fid_w=8 fid_tp=2 fid_pp=2 fid_extra=(--overlap-grad-reduce) ;;
    tp4pp2) fid_w=8 fid_tp=4 fid_pp=2 ;;
    tp2pp4) fid_w=8 fid_tp=2 fid_pp=4 ;;
    *) return 1 ;;
  esac
}
fid_all_cases="tp2 pp2 dp2 dp2_distopt_ovl moe_ep2 tp2pp2 tp4 moe_ep4 tp2pp2dp2 tp2pp2dp2_ovl tp4pp2 tp2pp4"

# fid_job_args ITERS: the job's script and arguments for the current spec (fid_args). Micro-batches per iteration:
# max(4, 2 x pp), so that pipelines have several in flight; global batch = micro-batch (2) x dp x that.
fid_job_args() {
  local dp=$((fid_w / (fid_tp * fid_pp))) mb=$((fid_pp * 2 > 4 ? fid_pp * 2 : 4))
  fid_gbs=$((${FIDELITY_MBS:-2} * dp * mb))
  fid_args=(pretrain_gpt.py "${FID_MODEL_ARGS[@]}" --train-iters "$1" --global-batch-size "$fid_gbs"
    --tensor-model-parallel-size "$fid_tp" --pipeline-model-parallel-size "$fid_pp")
  ((fid_ep > 1)) && fid_args+=(--expert-model-parallel-size "$fid_ep")
  fid_args+=("${fid_extra[@]}")
}

# fid_show CVD CMD...: the command for people (torchrun, prism-run, OUT/...), one line
fid_show() {
  local s="CUDA_VISIBLE_DEVICES=$1" a i=0
  shift
  local -a args=("$@")
  while ((i < ${#args[@]})); do
    a=${args[i]}
    if [ "$a" = "$PYTHON" ] && [ "${args[i + 1]:-}" = -m ] && [ "${args[i + 2]:-}" = torch.distributed.run ]; then
      s+=" torchrun"
      i=$((i + 3))
      continue
    fi
    [ "$a" = "$PRISM_RUN" ] && a=prism-run
    case $a in "$out"/*) a="OUT/${a#"$out"/}" ;; esac
    [[ "$a" =~ ^[A-Za-z0-9_./,=:+@%-]+$ ]] || a=$(printf '%q' "$a")
    s+=" $a"
    i=$((i + 1))
  done
  echo "$s"
}

# fid_exec DIR CVD CMD...: runs CMD in third_party/megatron on GPUs CVD under the timeout, the measurement hook on
# PYTHONPATH; DIR/out.log, DIR/cmd.txt, and rc/wall_s appended to DIR/meta.txt
fid_exec() {
  local dir=$1 cvd=$2 t0=$SECONDS rc
  shift 2
  mkdir -p "$dir"
  fid_show "$cvd" "$@" > "$dir/cmd.txt"
  (
    cd "$MEGATRON" || exit 2
    export CUDA_VISIBLE_DEVICES=$cvd PYTHONPATH="$fid_hook${PYTHONPATH:+:$PYTHONPATH}"
    export NCCL_NVLS_ENABLE=0 NCCL_NVLINK_SHARP_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
    export CUDA_DEVICE_MAX_CONNECTIONS=1 PYTHON_EXEC=${PYTHON_EXEC:-$PYTHON}
    # Why an empty compile cache for native runs: prism-run gives each worker one (docs/cli.md "Environment"), and a
    # cold torch.compile allocates what a warm one does not, so both sides compile cold.
    if [ "$1" != "$PRISM_RUN" ]; then
      rm -rf "$dir/compile-cache"
      export TORCHINDUCTOR_CACHE_DIR=$dir/compile-cache/inductor TRITON_CACHE_DIR=$dir/compile-cache/triton
    fi
    exec timeout -s INT -k 30 "$FIDELITY_T" "$@"
  ) > "$dir/out.log" 2>&1
  rc=$?
  rm -rf "$dir/compile-cache"
  printf 'rc=%s\nwall_s=%s\n' "$rc" $((SECONDS - t0)) >> "$dir/meta.txt"
  echo "$(basename "$dir"): exit $rc after $((SECONDS - t0)) s  ($(cat "$dir/cmd.txt"))"
  return "$rc"
}
fid_skip() {  # DIR KIND WHY
  rm -rf "$1"
  mkdir -p "$1"
  printf 'kind=%s\nskipped=%s\n' "$2" "$3" > "$1/meta.txt"
  echo "$(basename "$1"): skipped, $3"
}

fid_warmup() {
  local d=$fid_cfg/warmup
  rm -rf "$d"
  mkdir -p "$d"
  echo "kind=warmup" > "$d/meta.txt"
  local -a keep=("${fid_args[@]}")
  fid_job_args 3
  fid_exec "$d" "$(fid_devs "$fid_w")" "$PYTHON" -m torch.distributed.run --nproc-per-node "$fid_w" "${fid_args[@]}"
  fid_args=("${keep[@]}")
}

fid_native() {
  local d=$fid_cfg/native
  if ((${#fid_gpus[@]} < fid_w)); then
    fid_skip "$d" native "needs $fid_w GPUs (this host has ${#fid_gpus[@]})"
    return 0
  fi
  rm -rf "$d"
  mkdir -p "$d"
  echo "kind=native" > "$d/meta.txt"
  fid_exec "$d" "$(fid_devs "$fid_w")" "$PYTHON" -m torch.distributed.run --nproc-per-node "$fid_w" "${fid_args[@]}"
}

# Data-parallel replica 0 for real (prism-run collect), whose payloads a rank of another tensor-parallel rank replays.
fid_collect() {
  local d=$fid_cfg/collect replica=$((fid_tp * fid_pp))
  local n=$((${#fid_gpus[@]} < replica ? ${#fid_gpus[@]} : replica))
  ((n > 0)) || n=1
  rm -rf "$d"
  mkdir -p "$d"
  echo "kind=collect" > "$d/meta.txt"
  fid_exec "$d" "$(fid_devs "$n")" "$PRISM_RUN" collect --gpus "$n" --out "$d" --quiet "${fid_topo_opt[@]}" \
    torchrun --nnodes 1 --nproc-per-node "$fid_w" --master-port 29540 "${fid_args[@]}"
}

# fid_prism NAME RANKS PAYLOAD CVD NGPUS PORT: prism-run with RANKS real on NGPUS GPUs (CVD), the rest virtual.
# Concurrent runs need their own --out (the coordinator's Unix socket is OUT/coord.sock) and store port (the
# coordinator would fall back to a free port, but one each keeps the command lines exact).
fid_prism() {
  local name=$1 ranks=$2 payload=$3 cvd=$4 ngpus=$5 port=$6
  local d=$fid_cfg/$name
  rm -rf "$d"
  mkdir -p "$d"
  printf 'kind=prism\nranks=%s\npayload=%s\n' "$ranks" "$payload" > "$d/meta.txt"
  local -a opts=(--ranks "$ranks" --gpus "$ngpus" --out "$d" --quiet "${fid_topo_opt[@]}") extra=()
  [ "$payload" = recorded ] && opts+=(--payload recorded --payload-dir "$fid_cfg/collect")
  read -ra extra <<< "${FIDELITY_PRISM_ARGS:-}"
  opts+=("${extra[@]}")
  fid_exec "$d" "$cvd" "$PRISM_RUN" "${opts[@]}" \
    torchrun --nnodes 1 --nproc-per-node "$fid_w" --master-port "$port" "${fid_args[@]}"
}

fid_wants() { case " $FIDELITY_RUNS " in *" $1 "*) return 0 ;; esac; return 1; }

# fid_config NAME: every run of one configuration, then its check detail (fidelity_table.py --check).
fid_config() {
  local name=$1
  if ! fid_spec "$name"; then
    echo "unknown configuration $name (known: $fid_all_cases)" | tee "$out/fidelity_$name.detail"
    return 1
  fi
  fid_cfg=$fid_root/$name
  mkdir -p "$fid_cfg"
  fid_job_args "$FIDELITY_ITERS"
  # The second one-rank run: the last rank whose tensor-parallel rank is 0 (last pipeline stage, last data-parallel
  # replica), or with FIDELITY_LAST=last rank W-1 itself. Why not always W-1: alone, a rank of tensor-parallel rank
  # != 0 receives its batch and Megatron's do-train flags from virtual ranks and needs the recorded payloads of a
  # `prism-run collect` (docs/fidelity.md, "Which ranks, which payload").
  local last=$((fid_w - fid_tp)) payload_last=mirror ngpu=${#fid_gpus[@]}
  [ "${FIDELITY_LAST:-tp0}" = last ] && last=$((fid_w - 1))
  case $FIDELITY_PAYLOAD in
    recorded) payload_last=recorded ;;
    mirror) ;;
    *) ((last % fid_tp != 0)) && payload_last=recorded ;;
  esac
  printf 'name=%s\nworld=%s\ntp=%s\npp=%s\nep=%s\ndp=%s\ngbs=%s\niters=%s\nskip=%s\ngpus=%s\nextra=%s\n' \
    "$name" "$fid_w" "$fid_tp" "$fid_pp" "$fid_ep" $((fid_w / (fid_tp * fid_pp))) "$fid_gbs" "$FIDELITY_ITERS" \
    "$FIDELITY_SKIP" "$ngpu" "${fid_extra[*]}" > "$fid_cfg/config.txt"
  echo "== $name: world $fid_w, tp $fid_tp pp $fid_pp ep $fid_ep, global batch $fid_gbs, $ngpu GPU(s)"

  local key="tp$fid_tp-ep$((fid_ep > 1))"
  if [ "${FIDELITY_WARMUP:-1}" = 1 ] && ((ngpu >= fid_w)) && [[ " $fid_warm_keys " != *" $key "* ]] && fid_wants native; then
    fid_warmup && fid_warm_keys+=" $key"
  fi
  if fid_wants native; then fid_native; else fid_skip "$fid_cfg/native" native "not in FIDELITY_RUNS"; fi

  rm -rf "$fid_cfg/collect" "$fid_cfg"/prism_r*
  local want_last=0
  if fid_wants rlast; then
    if ((last == 0)); then
      fid_skip "$fid_cfg/prism_r$((fid_w - 1))" prism "tp rank $((fid_tp - 1)) alone needs recorded payloads (FIDELITY_LAST=last)"
      echo "ranks=$((fid_w - 1))" >> "$fid_cfg/prism_r$((fid_w - 1))/meta.txt"
    else
      want_last=1
      [ "$payload_last" = recorded ] && fid_collect
    fi
  fi

  local -a pids=()
  local r0_gpu=${fid_gpus[0]:-0} rl_gpu=${fid_gpus[0]:-0}
  ((ngpu >= 2)) && rl_gpu=${fid_gpus[1]}
  if fid_wants r0; then
    fid_prism prism_r0 0 mirror "$r0_gpu" 1 29510 &
    pids+=($!)
    ((ngpu >= 2)) || { wait "${pids[@]}"; pids=(); }
  fi
  if ((want_last)); then
    fid_prism "prism_r$last" "$last" "$payload_last" "$rl_gpu" 1 29520 &
    pids+=($!)
  fi
  ((${#pids[@]})) && wait "${pids[@]}"
  if fid_wants r01; then
    if ((ngpu >= 2)); then
      fid_prism prism_r0-1 0,1 mirror "$(fid_devs 2)" 2 29530
    else
      fid_skip "$fid_cfg/prism_r0-1" prism "needs 2 GPUs (this host has $ngpu)"
      echo "ranks=0,1" >> "$fid_cfg/prism_r0-1/meta.txt"
    fi
  fi
  "$fid_py" "$fid_repo/tests/gpu/fidelity_table.py" --check "$fid_cfg" --detail "$out/fidelity_$name.detail"
}

fid_targets() {
  "$fid_py" "$fid_repo/tests/gpu/fidelity_table.py" "$fid_root" --tsv "$out/fidelity.tsv" --md "$out/fidelity.md" \
    --detail "$out/fidelity_targets.detail" --targets
}

fid_main() {
  mkdir -p "$fid_root"
  "$fid_py" "$fid_repo/tests/gpu/fidelity_table.py" --write-hook "$fid_hook" || { echo "cannot write the hook"; return 1; }
  fid_detect_gpus
  fid_show - "${FID_MODEL_ARGS[@]}" | sed 's/^CUDA_VISIBLE_DEVICES=- //' > "$fid_root/model_args.txt"
  fid_topo_opt=()
  case ${FIDELITY_TOPOLOGY:-} in
    none) ;;
    "")
      "$fid_py" - "$fid_repo/examples/topologies/h200-8x400g.json" "$fid_root/h200-nvls-off.json" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
t["name"] = t.get("name", "h200") + "-nvls-off"
t["description"] = "h200-8x400g with NVLink SHARP off, as the native runs (NCCL_NVLS_ENABLE=0); tests/gpu/fidelity_suite.sh"
t.setdefault("nccl", {})["nvls"] = False
json.dump(t, open(sys.argv[2], "w"), indent=1)
PY
      fid_topo_opt=(--topology "$fid_root/h200-nvls-off.json") ;;
    /*) fid_topo_opt=(--topology "$FIDELITY_TOPOLOGY") ;;
    *) if [ -f "$FIDELITY_TOPOLOGY" ]; then fid_topo_opt=(--topology "$(realpath "$FIDELITY_TOPOLOGY")")
       else fid_topo_opt=(--topology "$FIDELITY_TOPOLOGY"); fi ;;
  esac
  local ngpu=${#fid_gpus[@]} c cases=${FIDELITY_CASES:-}
  if [ -z "$cases" ]; then
    for c in $fid_all_cases; do
      fid_spec "$c"
      if ((fid_w <= ngpu || (ngpu < 2 && fid_w == 2))); then cases+=" $c"; fi
    done
  fi
  echo "fidelity: GPUs [${fid_gpus[*]}], configurations:$cases, ${FIDELITY_ITERS} iterations (median of those after" \
    "${FIDELITY_SKIP}), topology ${fid_topo_opt[*]:-default}" | tee "$out/fidelity_plan.txt"
  ((ngpu >= 2)) || echo "fidelity: fewer than 2 GPUs: native and two-rank runs are skipped (smoke test)" | tee -a "$out/fidelity_plan.txt"
  fid_warm_keys=""
  for c in $cases; do
    check "fidelity_$c" fid_config "$c"
  done
  check fidelity_targets fid_targets
  echo
  cat "$out/fidelity.md" 2>/dev/null
}
fid_main
