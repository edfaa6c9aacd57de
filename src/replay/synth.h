// Synthetic Megatron-style execution graphs (`prism-run synth`): one training iteration (or several) of a GPT
// model under tensor, pipeline, data and expert parallelism, with Megatron-LM's 1F1B pipeline schedule
// (interleaved when vpp > 1), written with data-parallel deduplication: one role class per (tp, pp) position,
// every data-parallel replica bound to its own communicators. docs/simulate.md describes the graph.
#pragma once

#include <cstdint>
#include <string>

#include "prism/trace.h"

namespace prism::replay {

struct SynthOptions {
  // Parallel layout (cp must be 1). Global rank order tp-cp-ep-dp-pp (tp fastest), as Megatron's default.
  int tp = 1, pp = 1, dp = 1, ep = 1;
  int vpp = 1;             // model chunks per pipeline rank (interleaved schedule when > 1)
  int microbatches = 8;    // per iteration, per data-parallel replica
  int iterations = 1;

  // Model. Compute times derive from FLOPs (24 b s h^2 + 4 b s^2 h per layer forward, backward twice that) at
  // `tflops` achieved per GPU, unless fwd_us/bwd_us are given.
  int layers = 0;          // 0: the multiple of pp*vpp nearest above 32
  int hidden = 4096;
  int seq_len = 4096;
  int micro_batch_size = 1;
  int num_experts = 8;     // ep > 1: experts per MoE layer (every layer is MoE)
  int moe_topk = 2;
  double tflops = 400.0;
  double fwd_us = -1.0;    // per microbatch per model chunk; < 0: from FLOPs
  double bwd_us = -1.0;    // < 0: twice the forward
  double optimizer_us = -1.0;  // < 0: from the parameter count (memory bound)

  // Communication.
  bool tp_comm = false;            // per-layer tensor-parallel collectives on the compute stream
  bool sequence_parallel = true;   // tp_comm: all-gather + reduce-scatter (else all-reduce)
  bool distributed_optimizer = true;  // dp: reduce-scatter grads + all-gather params (else all-reduce grads)
  bool overlap_grad_reduce = true;    // dp grad buckets start during the last backward of each model chunk
  int dp_buckets = 0;                 // per model chunk; 0: one per 40M parameters (Megatron's bucket size)
  uint64_t act_bytes = 0;             // pp message size; 0: s * b * h * 2 (/ tp with sequence parallel)
  uint64_t grad_bytes = 0;            // dp reduce-scatter S per model chunk; 0: from the parameter count
  trace::DType grad_dtype = trace::DType::kF32;

  std::string topology = "h100-8x400g";  // recorded in the graph (a preset name or JSON text)
};

// Bounds on the options, checked by Synthesize and by prism-run's flags. Why: a class's node lists grow with
// iterations x microbatches x chunks x per-layer collectives; 2e9 microbatches is a bad_alloc, not a graph.
inline constexpr int kSynthMaxMicrobatches = 1 << 16;
inline constexpr int kSynthMaxIterations = 1 << 16;
inline constexpr int64_t kSynthMaxNodesPerClass = int64_t{1} << 26;

// Builds the graph. False + *error for an impossible layout (names the option).
bool Synthesize(const SynthOptions& opts, trace::Trace* out, std::string* error);

}  // namespace prism::replay
