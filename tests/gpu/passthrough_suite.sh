# shellcheck shell=bash
# Passthrough (issue 10; docs/libprism.md): real NCCL among real ranks on distinct GPUs. Sourced by tests/gpu/run.sh
# (suite `passthrough`). tests/gpu/passthrough_check.py:
#  - 2+ GPUs: world 2 (every rank real: the world and the pair pass through) and world 8 (ranks 0,1 real: the pair
#    passes through, the world stays emulated), and world 8 with --no-passthrough for the bandwidth contrast;
#  - any GPU count: world 1 with PRISM_PASSTHROUGH_MIN_MEMBERS=1 (the one-member world runs on the real NCCL: the
#    real-NCCL path under libprism's interposition, on one GPU), and Megatron's tiny GPT the same way against a
#    native run (iteration time, max allocated).
: "${out:?sourced by tests/gpu/run.sh}"
source tests/gpu/megatron_env.sh
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
passthrough_case() {  # NAME RANKS GPUS WORLD [prism-run options]
  local name=$1 ranks=$2 gpus=$3 world=$4
  shift 4
  (timeout -s INT -k 20 "${PASSTHROUGH_TIMEOUT:-120}" "$PRISM_RUN" --ranks "$ranks" --gpus "$gpus" --out "$out/$name" "$@" torchrun --nnodes 1 \
     --nproc-per-node "$world" tests/gpu/passthrough_check.py) > "$out/$name.out" 2>&1
  local rc=$?
  grep -h "^CHECK\|^PASSTHROUGH" "$out/$name"/logs/rank0.log > "$out/$name.checks" 2>/dev/null
  local n; n=$(grep -h "passthrough, real NCCL communicator" "$out/$name"/logs/*.log 2>/dev/null | wc -l)
  { grep -h "^PASSTHROUGH" "$out/$name.checks"; grep -h "pair_allreduce_256MiB" "$out/$name.checks" | sed 's/.*PASS //';
    echo "real_comms_logged=$n"; } > "$out/$name.detail"
  [ $rc -eq 0 ] && grep -q "^PASSTHROUGH .* PASS" "$out/$name.checks"
}
# Megatron tiny GPT, world 1: natively, then under prism-run with the world passing through. Iteration time (median
# of Megatron's own "elapsed time per iteration" after the first 5) and max allocated of each, and their ratio.
passthrough_megatron_w1() {
  local name=passthrough_megatron_w1 d=$out/passthrough_megatron_w1
  mkdir -p "$d"
  local -a job=(pretrain_gpt.py "${MEGATRON_TINY_ARGS[@]}" --global-batch-size 4 --train-iters 30)
  # Why a warm-up: a cold first run peaks higher (megatron_suite.sh, memory_warmup); both measured runs are warm.
  (cd "$MEGATRON" && timeout -s INT -k 20 200 "$PYTHON" -m torch.distributed.run --nproc-per-node 1 \
     "${job[@]:0:${#job[@]}-1}" 3) > "$d/warmup.log" 2>&1
  (cd "$MEGATRON" && timeout -s INT -k 20 200 "$PYTHON" -m torch.distributed.run --nproc-per-node 1 \
     "${job[@]}") > "$d/native.log" 2>&1 || return 1
  (cd "$MEGATRON" && PRISM_PASSTHROUGH_MIN_MEMBERS=1 timeout -s INT -k 20 200 "$PRISM_RUN" --ranks 0 --gpus 1 \
     --out "$d/prism" --quiet torchrun --nproc-per-node 1 "${job[@]}") > "$d/prism.out" 2>&1 || return 1
  "$PYTHON" - "$d/native.log" "$d"/prism/logs/rank0.log > "$out/$name.detail" <<'PY'
import re, statistics, sys
def read(path):
    t = [float(m) for m in re.findall(r"elapsed time per iteration \(ms\): ([0-9.]+)", open(path).read())]
    a = re.findall(r"max allocated: ([0-9.]+)", open(path).read())
    return statistics.median(t[5:]) if len(t) > 5 else float("nan"), float(a[-1]) if a else float("nan")
nt, nm = read(sys.argv[1]); pt, pm = read(sys.argv[2])
print("native %.2f ms %.2f MB, prism(passthrough) %.2f ms %.2f MB, time %+.2f %%, mem %+.3f %%"
      % (nt, nm, pt, pm, 100 * (pt / nt - 1), 100 * (pm / nm - 1)))
PY
  grep -q "passthrough, real NCCL communicator" "$d"/prism/logs/rank0.log
}
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
# PASSTHROUGH_CASES selects cases (default: all that fit the GPUs found).
want() { [[ " ${PASSTHROUGH_CASES:-w1 megatron_w1 w2 w8 w8_off} " == *" $1 "* ]]; }
want w1 && PRISM_PASSTHROUGH_MIN_MEMBERS=1 check passthrough_w1_real_nccl passthrough_case passthrough_w1_real_nccl 0 1 1
want megatron_w1 && check passthrough_megatron_w1 passthrough_megatron_w1
if [ "${ngpu:-0}" -ge 2 ]; then
  want w2 && check passthrough_w2_all_real passthrough_case passthrough_w2_all_real 0,1 2 2
  want w8 && check passthrough_w8_ranks01 passthrough_case passthrough_w8_ranks01 0,1 2 8
  want w8_off && check passthrough_w8_ranks01_off passthrough_case passthrough_w8_ranks01_off 0,1 2 8 --no-passthrough
else
  echo "passthrough suite: the 2-rank cases need 2 GPUs (found ${ngpu:-0})" | tee -a "$table"
fi
