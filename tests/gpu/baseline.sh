#!/usr/bin/env bash
# Facts the emulation is compared against, taken without Prism: which CUDA/NCCL symbols torch imports, the
# TCPStore wire of an unmodified Megatron start, and the tiny Megatron run's own iteration time and memory.
# usage (on the GPU machine, repo root): tests/gpu/baseline.sh OUT_DIR
set -uo pipefail
out=${1:?out dir}; mkdir -p "$out"
source tests/gpu/megatron_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$out/gpu.txt" 2>&1
tl=$($PYTHON -c 'import torch,os;print(os.path.dirname(torch.__file__)+"/lib")')
{ for l in libtorch_cuda.so libc10_cuda.so libtorch_python.so; do echo "== $l"; nm -D --undefined-only "$tl/$l" | grep -E ' (cuda|cu[A-Z]|nccl)' ; done; } > "$out/torch_imports.txt" 2>&1
$PYTHON -c 'import torch;print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version())' >> "$out/gpu.txt" 2>&1
cd "$MEGATRON"
$PYTHON "$OLDPWD/tests/gpu/capture_store_wire.py" "$out/wire" 1 -- env RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 \
  LOCAL_WORLD_SIZE=1 $PYTHON pretrain_gpt.py "${MEGATRON_TINY_ARGS[@]}" --global-batch-size 4 --train-iters 3 \
  > "$out/wire.log" 2>&1
echo "capture rc=$?" >> "$out/wire.log"
tar -C "$out" -cf "$out/torch_store_wire.tar" wire && rm -rf "$out/wire"
$PYTHON -m torch.distributed.run --nproc-per-node 1 pretrain_gpt.py "${MEGATRON_TINY_ARGS[@]}" \
  --global-batch-size 4 --train-iters 10 > "$out/megatron_world1.log" 2>&1
echo "megatron rc=$?" >> "$out/megatron_world1.log"
cd "$OLDPWD"
