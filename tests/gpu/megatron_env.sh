# Sourced by GPU scripts: the unmodified Megatron-LM export (third_party/megatron, git-ignored, carried) and
# the tiny GPT arguments that ran on the GPU machine (shared/reference/gpu-machine-findings.md).
export PYTHON=${PYTHON:-/opt/torch/.venv/bin/python3}
export MEGATRON=${MEGATRON:-$PWD/third_party/megatron}
export PYTHONPATH="$MEGATRON${PYTHONPATH:+:$PYTHONPATH}"
export CUDA_DEVICE_MAX_CONNECTIONS=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
MEGATRON_TINY_ARGS=(--num-layers 2 --hidden-size 256 --num-attention-heads 4 --seq-length 256
  --max-position-embeddings 256 --micro-batch-size 2 --log-interval 1 --eval-iters 1 --eval-interval 1000
  --mock-data --tokenizer-type NullTokenizer --vocab-size 1024 --transformer-impl local --lr 1e-4 --bf16
  --no-gradient-accumulation-fusion --disable-gloo-process-groups --no-persist-layer-norm
  --no-masked-softmax-fusion)
# The fidelity and record suites' model (docs/fidelity.md "The model"): about 470 M parameters, GPU-bound
# iterations; FIDELITY_LAYERS / _HIDDEN / _HEADS / _SEQ change it.
MEGATRON_MEDIUM_ARGS=(--num-layers "${FIDELITY_LAYERS:-8}" --hidden-size "${FIDELITY_HIDDEN:-2048}"
  --num-attention-heads "${FIDELITY_HEADS:-16}" --seq-length "${FIDELITY_SEQ:-1024}"
  --max-position-embeddings "${FIDELITY_SEQ:-1024}" --micro-batch-size "${FIDELITY_MBS:-2}" --log-interval 1
  --eval-iters 1 --eval-interval 1000 --mock-data --tokenizer-type NullTokenizer --vocab-size 32000
  --transformer-impl local --lr 1e-4 --bf16 --no-gradient-accumulation-fusion --disable-gloo-process-groups
  --no-persist-layer-norm --no-masked-softmax-fusion)
