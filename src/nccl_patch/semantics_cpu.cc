// CPU executor of payload steps: the reference the GPU kernels must match bit for bit. The element math is the
// same code (nccl_patch/dtype_math.h) the kernels in src/interpose/kernels/payload.cu run.
#include <cstring>

#include "nccl_patch/dtype_math.h"
#include "nccl_patch/semantics.h"

namespace prism::payload {
namespace {

void* Resolve(const HostBuffers& b, BufferId id, uint64_t offset) {
  const int i = static_cast<int>(id);
  if (i <= 0 || i >= kNumBufferIds || b.base[i] == nullptr) return nullptr;
  return static_cast<char*>(b.base[i]) + offset;
}

}  // namespace

HostBuffers HostBuffersOf(const OpDesc& desc) {
  HostBuffers b;
  b.base[static_cast<int>(BufferId::kSend)] = reinterpret_cast<void*>(desc.send_addr);
  b.base[static_cast<int>(BufferId::kRecv)] = reinterpret_cast<void*>(desc.recv_addr);
  b.base[static_cast<int>(BufferId::kMirrorSend)] = reinterpret_cast<void*>(desc.mirror_send_addr);
  return b;
}

Status ExecuteCpu(const Step& step, const HostBuffers& buffers) {
  if (step.kind == StepKind::kNoop) return Status::kOk;
  void* dst = Resolve(buffers, step.dst_buf, step.dst_offset);
  if (dst == nullptr) return Status::kInvalidArgument;
  const bool needs_src = step.kind == StepKind::kCopy || step.kind == StepKind::kTile ||
                         step.kind == StepKind::kScale || step.kind == StepKind::kPower ||
                         step.kind == StepKind::kMulScalar;
  const void* src = needs_src ? Resolve(buffers, step.src_buf, step.src_offset) : nullptr;
  if (needs_src && src == nullptr) return Status::kInvalidArgument;
  const int dtype = static_cast<int>(step.dtype);

  switch (step.kind) {
    case StepKind::kCopy:
      std::memmove(dst, src, step.bytes);
      return Status::kOk;
    case StepKind::kFillZero:
      std::memset(dst, 0, step.bytes);
      return Status::kOk;
    case StepKind::kTile: {
      if (step.tile_bytes == 0 || step.bytes % step.tile_bytes != 0) return Status::kInvalidArgument;
      for (uint64_t off = 0; off < step.bytes; off += step.tile_bytes) {
        std::memcpy(static_cast<char*>(dst) + off, src, step.tile_bytes);
      }
      return Status::kOk;
    }
    case StepKind::kScale:
      PRISM_PAYLOAD_DTYPE_SWITCH(dtype, D, return Status::kInvalidArgument,
                                 math::ScaleRange<D>(dst, src, 0, step.count, 1, step.param))
      return Status::kOk;
    case StepKind::kPower:
      PRISM_PAYLOAD_DTYPE_SWITCH(dtype, D, return Status::kInvalidArgument,
                                 math::PowerRange<D>(dst, src, 0, step.count, 1, step.param))
      return Status::kOk;
    case StepKind::kMulScalar: {
      const uint64_t scalar =
          math::LoadScalarBits(dtype, step.param, reinterpret_cast<const void*>(step.scalar_addr));
      PRISM_PAYLOAD_DTYPE_SWITCH(dtype, D, return Status::kInvalidArgument,
                                 math::MulScalarRange<D>(dst, src, 0, step.count, 1, scalar))
      return Status::kOk;
    }
    case StepKind::kFillRandom:
      PRISM_PAYLOAD_DTYPE_SWITCH(dtype, D, return Status::kInvalidArgument,
                                 math::RandomRange<D>(dst, 0, step.count, 1, step.param, step.index_base))
      return Status::kOk;
    case StepKind::kNoop:
      break;
  }
  return Status::kInvalidArgument;
}

Status RunCpu(const OpDesc& desc) {
  StepList steps;
  if (Status s = Plan(desc, &steps); s != Status::kOk) return s;
  const HostBuffers buffers = HostBuffersOf(desc);
  for (uint32_t i = 0; i < steps.size; ++i) {
    if (Status s = ExecuteCpu(steps.steps[i], buffers); s != Status::kOk) return s;
  }
  return Status::kOk;
}

}  // namespace prism::payload
