// prism-run synth: write a synthetic Megatron-style graph (src/replay/synth.h builds it).
#include <iostream>

#include "replay/synth.h"
#include "replay/trace_io.h"
#include "replay/trace_validate.h"
#include "subcommands.h"

namespace prism::cli {

void AddSynth(CLI::App& app, int* rc) {
  auto* sub = app.add_subcommand("synth", "write a synthetic Megatron-style graph (1F1B, interleaved with --vpp)");
  auto o = std::make_shared<replay::SynthOptions>();
  auto out = std::make_shared<std::string>();
  auto grad_dtype = std::make_shared<std::string>("f32");
  auto dp_allreduce = std::make_shared<bool>(false);
  sub->add_option("-o,--output", *out, "output file: .prism (CBOR) or .prism.json (JSON)")->required();
  sub->add_option("--tp", o->tp, "tensor-parallel size")->capture_default_str()
      ->check(Positive(limits::kMaxWorldSize));
  sub->add_option("--pp", o->pp, "pipeline-parallel size")->capture_default_str()
      ->check(Positive(limits::kMaxWorldSize));
  sub->add_option("--dp", o->dp, "data-parallel size")->capture_default_str()
      ->check(Positive(limits::kMaxWorldSize));
  sub->add_option("--ep", o->ep, "expert-parallel size (every layer MoE when > 1; divides dp)")->capture_default_str()
      ->check(Positive(limits::kMaxWorldSize));
  sub->add_option("--vpp", o->vpp, "model chunks per pipeline rank (interleaved 1F1B when > 1)")->capture_default_str()
      ->check(Positive(1 << 10));
  sub->add_option("--microbatches", o->microbatches, "microbatches per iteration")->capture_default_str()
      ->check(Positive(replay::kSynthMaxMicrobatches));
  sub->add_option("--iterations", o->iterations, "training iterations")->capture_default_str()
      ->check(Positive(replay::kSynthMaxIterations));
  sub->add_option("--layers", o->layers, "transformer layers (default: multiple of pp*vpp from 32)")
      ->check(Positive(1 << 16));
  sub->add_option("--hidden", o->hidden, "hidden size")->capture_default_str()
      ->check(Positive(1 << 24));
  sub->add_option("--seq-len", o->seq_len, "sequence length")->capture_default_str()
      ->check(Positive(1 << 24));
  sub->add_option("--micro-batch-size", o->micro_batch_size, "micro-batch size")->capture_default_str()
      ->check(Positive(1 << 24));
  sub->add_option("--num-experts", o->num_experts, "experts per MoE layer (--ep > 1)")->capture_default_str()
      ->check(Positive(1 << 16));
  sub->add_option("--moe-topk", o->moe_topk, "experts per token")->capture_default_str()
      ->check(Positive(1 << 16));
  sub->add_option("--tflops", o->tflops, "achieved TFLOP/s per GPU for compute times")->capture_default_str()
      ->check(Positive(1e6));
  sub->add_option("--fwd-us", o->fwd_us, "forward time per microbatch per model chunk (default: from FLOPs)")
      ->check(DurationUs());
  sub->add_option("--bwd-us", o->bwd_us, "backward time per microbatch per model chunk (default: 2x forward)")
      ->check(DurationUs());
  sub->add_option("--optimizer-us", o->optimizer_us, "optimizer step time (default: from the parameter count)")
      ->check(DurationUs());
  sub->add_flag("--tp-comm", o->tp_comm, "per-layer tensor-parallel collectives on the compute stream");
  sub->add_flag("--sequence-parallel,!--no-sequence-parallel", o->sequence_parallel,
                "tensor-parallel all-gather/reduce-scatter instead of all-reduce (default on)");
  sub->add_flag("--dp-allreduce", *dp_allreduce, "all-reduce gradients instead of the distributed optimizer's "
                                                 "reduce-scatter + all-gather");
  sub->add_flag("--overlap-grad-reduce,!--no-overlap-grad-reduce", o->overlap_grad_reduce,
                "start gradient buckets during the last backward of each chunk (default on)");
  sub->add_option("--dp-buckets", o->dp_buckets, "gradient buckets per model chunk (default: one per 40M params)")
      ->check(NonNegative(1 << 20));
  sub->add_option("--act-bytes", o->act_bytes, "pipeline message size (default: s*b*h*2, / tp with sequence parallel)")
      ->check(NonNegative(limits::kMaxBytes));
  sub->add_option("--grad-bytes", o->grad_bytes, "gradient bytes per model chunk (default: from the parameter count)")
      ->check(NonNegative(limits::kMaxBytes));
  sub->add_option("--grad-dtype", *grad_dtype, "gradient reduction dtype: f32 or bf16")->capture_default_str();
  sub->add_option("--topology", o->topology, "topology recorded in the graph")->capture_default_str();
  sub->callback([rc, o, out, grad_dtype, dp_allreduce] {
    const std::string me = "prism-run synth: ";
    o->distributed_optimizer = !*dp_allreduce;
    o->grad_dtype = trace::ParseDType(*grad_dtype);
    if (o->grad_dtype != trace::DType::kF32 && o->grad_dtype != trace::DType::kBF16) {
      std::cerr << me << "--grad-dtype must be f32 or bf16 (got \"" << *grad_dtype << "\")\n";
      *rc = kExitBadInput;
      return;
    }
    trace::Trace t;
    std::string err;
    if (!replay::Synthesize(*o, &t, &err)) {
      std::cerr << me << err << "\n";
      *rc = kExitBadInput;
      return;
    }
    // Why: the generator is checked by the same validator every reader uses.
    std::vector<std::string> errors = replay::ValidateTrace(t);
    if (!errors.empty()) {
      std::cerr << me << "internal error: the synthesized graph does not validate:\n";
      for (const auto& e : errors) std::cerr << "  " << e << "\n";
      *rc = kExitFailure;
      return;
    }
    if (!replay::WriteTrace(t, *out, &err)) {
      std::cerr << me << err << "\n";
      *rc = kExitBadInput;
      return;
    }
    size_t nodes = 0;
    for (const auto& c : t.classes) {
      for (const auto& s : c.streams) nodes += s.nodes.size();
    }
    std::cout << "prism-run synth: wrote " << *out << ": " << t.world_size << " ranks (tp=" << o->tp << " pp=" << o->pp
              << " dp=" << o->dp << (o->ep > 1 ? " ep=" + std::to_string(o->ep) : "")
              << (o->vpp > 1 ? " vpp=" + std::to_string(o->vpp) : "") << "), " << t.classes.size() << " classes, "
              << nodes << " nodes, " << t.comms.size() << " communicators, " << o->microbatches << " microbatches x "
              << o->iterations << " iteration" << (o->iterations == 1 ? "" : "s") << "\n";
    *rc = kExitOk;
  });
}

}  // namespace prism::cli
