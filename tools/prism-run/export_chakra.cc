// prism-run export-chakra: PrismTrace -> Chakra execution traces for ASTRA-sim (one .et per rank plus the
// communicator-group JSON; src/replay/chakra/chakra_export.h does the work, docs/chakra.md the mapping).
#include <iostream>
#include <memory>

#include "subcommands.h"

#include "replay/chakra/chakra_export.h"
#include "replay/trace_io.h"

namespace prism::cli {

void AddExportChakra(CLI::App& app, int* rc) {
  auto* sub = app.add_subcommand("export-chakra", "PrismTrace -> Chakra execution traces (ASTRA-sim's input)");
  struct Args {
    std::string graph, dir, prefix = "prism", allgather_comm_size = "input";
    bool no_prism_attrs = false, quiet = false;
  };
  auto a = std::make_shared<Args>();
  sub->add_option("graph", a->graph, "PrismTrace to export (.prism or .prism.json)")->required();
  sub->add_option("dir", a->dir, "output directory (created): <prefix>.<rank>.et and comm_group.json")->required();
  sub->add_option("--prefix", a->prefix, "file name prefix")->capture_default_str();
  sub->add_option("--allgather-comm-size", a->allgather_comm_size,
                  "what an ALL_GATHER's comm_size counts: input (each rank's input, as ASTRA-sim reads it) or "
                  "output (the whole gathered output, nccl-tests' S)")
      ->check(CLI::IsMember({"input", "output"}))
      ->capture_default_str();
  sub->add_flag("--no-prism-attrs", a->no_prism_attrs,
                "write only Chakra's own attributes (import-chakra then cannot give back streams, iterations, "
                "dtypes, exact durations)");
  sub->add_flag("--quiet", a->quiet, "no summary on stdout");
  sub->callback([rc, a] {
    const std::string me = "prism-run export-chakra: ";
    trace::Trace t;
    std::string err;
    if (!replay::ReadTrace(a->graph, &t, &err)) {
      std::cerr << me << err << "\n";
      *rc = kExitBadInput;
      return;
    }
    chakra::ExportOptions o;
    o.out_dir = a->dir;
    o.prefix = a->prefix;
    o.allgather_comm_size =
        a->allgather_comm_size == "output" ? chakra::AllGatherCommSize::kOutput : chakra::AllGatherCommSize::kInput;
    o.prism_attrs = !a->no_prism_attrs;
    chakra::ExportSummary s;
    if (!chakra::ExportChakra(t, o, &s, &err)) {
      std::cerr << me << err << "\n";
      *rc = kExitFailure;
      return;
    }
    for (const auto& w : s.warnings) std::cerr << me << "warning: " << w << "\n";
    if (!a->quiet) std::cout << s.Format();
    *rc = kExitOk;
  });
}

}  // namespace prism::cli
