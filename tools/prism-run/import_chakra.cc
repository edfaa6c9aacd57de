// prism-run import-chakra: Chakra execution traces (one ET file per rank) -> PrismTrace
// (src/replay/chakra/chakra_import.h does the work; docs/chakra.md says what maps to what).
#include <iostream>
#include <memory>

#include "subcommands.h"

#include "replay/chakra/chakra_import.h"
#include "replay/trace_io.h"

namespace prism::cli {

void AddImportChakra(CLI::App& app, int* rc) {
  auto* sub = app.add_subcommand("import-chakra", "Chakra execution traces (one .et per rank) -> PrismTrace");
  struct Args {
    std::string input, output, comm_group, prefix, allgather_comm_size = "input", send_completion;
    bool no_ctrl_deps = false, quiet = false;
  };
  auto a = std::make_shared<Args>();
  sub->add_option("input", a->input,
                  "directory of <prefix>.<rank>.et files, or a prefix as ASTRA-sim's --workload-configuration")
      ->required();
  sub->add_option("-o,--output", a->output, "PrismTrace to write: .prism (CBOR) or .prism.json (JSON)")->required();
  sub->add_option("--comm-group", a->comm_group,
                  "ASTRA-sim communicator-group JSON {\"<pg_name>\": [ranks]} (default: <dir>/comm_group.json "
                  "when present)");
  sub->add_option("--prefix", a->prefix, "which <prefix>.<rank>.et files, when the directory holds several");
  sub->add_option("--allgather-comm-size", a->allgather_comm_size,
                  "what an ALL_GATHER's comm_size counts: input (each rank's input, as ASTRA-sim reads it) or "
                  "output (the whole gathered output, nccl-tests' S)")
      ->check(CLI::IsMember({"input", "output"}))
      ->capture_default_str();
  sub->add_option("--send-completion", a->send_completion,
                  "the graph's send_completion: rendezvous, eager or nccl (default: eager, as ASTRA-sim completes "
                  "a send without its receive; files Prism wrote keep theirs)")
      ->check(CLI::IsMember({"rendezvous", "eager", "nccl"}));
  sub->add_flag("--no-ctrl-deps", a->no_ctrl_deps,
                "honour data_deps only, as ASTRA-sim does (default: ctrl_deps are dependencies too)");
  sub->add_flag("--quiet", a->quiet, "no summary on stdout");
  sub->callback([rc, a] {
    const std::string me = "prism-run import-chakra: ";
    chakra::ImportOptions o;
    o.input = a->input;
    o.prefix = a->prefix;
    o.allgather_comm_size =
        a->allgather_comm_size == "output" ? chakra::AllGatherCommSize::kOutput : chakra::AllGatherCommSize::kInput;
    o.comm_group = a->comm_group;
    o.ctrl_deps = !a->no_ctrl_deps;
    o.send_completion = trace::ParseSendCompletion(a->send_completion);
    trace::Trace t;
    chakra::ImportSummary s;
    std::string err;
    if (!chakra::ImportChakra(o, &t, &s, &err)) {
      std::cerr << me << err << "\n";
      *rc = kExitBadInput;
      return;
    }
    for (const auto& note : s.notes) std::cerr << me << "note: " << note << "\n";
    if (!replay::WriteTrace(t, a->output, &err)) {
      std::cerr << me << err << "\n";
      *rc = kExitFailure;
      return;
    }
    if (!a->quiet) std::cout << s.Format() << "wrote " << a->output << "\n";
    *rc = kExitOk;
  });
}

}  // namespace prism::cli
