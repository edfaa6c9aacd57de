// Stage 1 of the paper's procedure (docs/collect.md): `prism-run collect`, and the collect stage of the default
// procedure (launcher/stages.h). Runs data-parallel replica 0 of the job (every rank with dp == 0: tp x pp x cp
// ranks) for real, with real data between them (exchange), records what each received from real data
// (payloads/rank<R>.bin, for `--payload recorded`), and writes the bare graph of all ranks (observed.prism) from
// their event files, through the same launcher path as emulate (launcher/emulate.h).
//
// Expert parallelism: real_routing adds every member of each replica-0 rank's expert-parallel group, so MoE routing
// comes from real data on every ep coordinate. Without it the ranks of other ep coordinates run virtual (mirrored
// data) and their classes repeat the nodes of the real rank that differs only in ep (EP symmetry assumed).
//
// Context switching (swap.enabled, docs/collect.md "Context switching"): when the replica's ranks do not all fit in
// GPU memory, ranks start as their GPU has room and ranks blocked in an exchange are swapped out to host RAM with
// the CUDA checkpoint API (coordinator/swap/swap_scheduler.h, swap_driver.h).
#pragma once

#include <string>
#include <vector>

#include "launcher/emulate.h"

namespace prism::launcher {

struct CollectResult {
  int exit_code = 0;
  std::string graph;         // OUT/observed.prism, "" when it was not written
  int payload_files = 0;
  uint64_t payload_bytes = 0;
  bool out_of_memory = false;  // a rank's log says CUDA ran out of memory (the ranks did not fit: retry with swap)
};

// `e` holds the emulate options of the run (out, layout, gpus, swap, ...); Collect sets what makes it a collect
// (one replica, payload recording unless no_payloads, real routing).
CollectResult Collect(EmulateOptions e, bool real_routing, bool no_payloads, const std::vector<std::string>& command,
                      const std::string& prefix = "prism collect: ");

}  // namespace prism::launcher
