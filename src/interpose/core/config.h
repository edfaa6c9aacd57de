// libprism settings: one table (name, environment variable, default, description) that feeds parsing and
// docs/libprism.md. Read once, in the library constructor (the only thing the constructor does), into the
// process's runtime (runtime.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "prism/limits.h"

namespace prism::interpose {

enum class GateKind : uint8_t { kInvalid = 0, kWait, kSpin, kNone };

struct Setting {
  const char* env;
  const char* default_value;
  const char* description;
};

// Every environment variable libprism reads (docs/libprism.md lists the same table; a unit test checks it).
extern const Setting kSettings[];
extern const int kNumSettings;

struct Config {
  int rank = 0;                 // logical global rank of this process
  int world_size = 1;           // logical world size
  int local_rank = 0;           // logical local rank (the device ordinal the job will ask for)
  int gpus_per_node = 0;        // virtual devices the job sees; 0 = no device virtualisation
  int phys_device = 0;          // physical ordinal (within CUDA_VISIBLE_DEVICES) every virtual device maps to
  std::string out_dir;          // where rank<R>.events.jsonl goes ("" = no event file)
  std::string coord_socket;     // coordinator's Unix socket ("" = none)
  std::string coord_addr;       // coordinator's TCP event bus "HOST:PORT" (another host's coordinator)
  std::string topology;         // cost-model topology: preset name, file or inline JSON
  std::string payload = "mirror";
  GateKind gate = GateKind::kWait;
  double fixed_dur_us = -1.0;   // >= 0: every operation takes exactly this long (tests)
  uint64_t seed = 1;
  int spin_ctas = 0;            // CTAs of the spinning gate; 0 = the cost model's channel count (else 16)
  std::vector<int> real_ranks;  // global ranks run for real in this emulation (default: {rank})
  bool exchange = true;         // move real data between real members of a communicator (PRISM_EXCHANGE)
  bool send_rendezvous = false;  // an exchanged send waits until its receive is posted (PRISM_SEND_RENDEZVOUS)
  bool passthrough = true;      // real NCCL among all-real members on distinct GPUs (PRISM_PASSTHROUGH)
  bool arrival_by_event = false;  // PRISM_ARRIVAL: arrival stamps by event record (event) or stamp kernel (kernel)
  bool gate_open_stamps = false;   // PRISM_GATE_OPEN_STAMPS=1: stamp each gate's opening on the GPU (diagnosis)
  bool passthrough_events = true;  // time passthrough operations on the GPU and log them (PRISM_PASSTHROUGH_EVENTS)
  int passthrough_timeout_s = 600;  // how long a member waits for rank 0's real unique id
  std::string graph;            // PRISM_GRAPH: the coordinator replays virtual ranks from a graph, so every
                                // communicator asks it for release times (not only those with several real members)
  std::string payload_file;     // recorded payloads this rank replays (PRISM_PAYLOAD_FILE, policy recorded)
  std::string record_payloads;  // file this rank records its received payloads into (PRISM_RECORD_PAYLOADS)
  uint64_t payload_max_bytes = limits::kDefaultPayloadMaxBytes;  // PRISM_PAYLOAD_MAX_BYTES: larger payloads are not recorded or replayed (0: all)
  int kernels_toggle = 0;       // PRISM_KERNELS_TOGGLE: CUPTI on for N iterations, off for N, ... (0: always on)
  int gate_toggle = 0;          // PRISM_GATE_TOGGLE: gates on for N iterations, off for N, ... (0: always on)
  int kernels = 0;              // PRISM_KERNELS: 0 off, 1 CUPTI kernels/memcpy/memset, 2 also NVTX (core/kernel_trace.h)
  std::vector<std::string> errors;  // bad values seen (logged once on first use; defaults used instead)

  bool IsReal(int global_rank) const;
};

// Fills *c from `getenv`-like lookup (nullptr = unset). Bad values are reported in c->errors and the default kept.
using EnvLookup = const char* (*)(const char* name);
void LoadConfig(EnvLookup lookup, Config* c);

// Parses "0,5,8-11" into ranks. False on malformed input.
bool ParseRankList(const std::string& text, std::vector<int>* out);

// The current runtime's configuration (runtime.h: the process's is read from the environment by the library
// constructor; a test's is the one it constructed its runtime with).
const Config& Cfg();

}  // namespace prism::interpose
