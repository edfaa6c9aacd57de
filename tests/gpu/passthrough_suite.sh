# shellcheck shell=bash
# Passthrough (issue 10; docs/libprism.md): real NCCL among real ranks on distinct GPUs. Sourced by tests/gpu/run.sh
# (suite `passthrough`); needs 2 GPUs. World 2 (every rank real: the world and the pair pass through) and world 8
# (ranks 0,1 real: the pair passes through, the world stays emulated), tests/gpu/passthrough_check.py.
: "${out:?sourced by tests/gpu/run.sh}"
source tests/gpu/megatron_env.sh
passthrough_case() {  # NAME WORLD [prism-run options]
  local name=$1 world=$2
  shift 2
  (timeout -s INT -k 20 240 "$PRISM_RUN" --ranks 0,1 --gpus 2 --out "$out/$name" "$@" torchrun --nnodes 1 \
     --nproc-per-node "$world" tests/gpu/passthrough_check.py) > "$out/$name.out" 2>&1
  local rc=$?
  grep -h "^CHECK\|^PASSTHROUGH" "$out/$name"/logs/rank0.log > "$out/$name.checks" 2>/dev/null
  local n; n=$(grep -h "passthrough, real NCCL communicator" "$out/$name"/logs/*.log 2>/dev/null | wc -l)
  { grep -h "^PASSTHROUGH" "$out/$name.checks"; grep -h "pair_allreduce_256MiB" "$out/$name.checks" | sed 's/.*PASS //';
    echo "real_comms_logged=$n"; } > "$out/$name.detail"
  [ $rc -eq 0 ] && grep -q "^PASSTHROUGH .* PASS" "$out/$name.checks"
}
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
if [ "${ngpu:-0}" -ge 2 ]; then
  check passthrough_w2_all_real passthrough_case passthrough_w2_all_real 2
  check passthrough_w8_ranks01 passthrough_case passthrough_w8_ranks01 8
  # The same pair emulated (--no-passthrough: exchange through the coordinator), for the bandwidth contrast.
  check passthrough_w8_ranks01_off passthrough_case passthrough_w8_ranks01_off 8 --no-passthrough
else
  echo "passthrough suite: needs 2 GPUs (found ${ngpu:-0})" | tee -a "$table"
fi
