#include "interpose/core/config.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "common/rank_list.h"

namespace prism::interpose {

const Setting kSettings[] = {
    {"PRISM_RANK", "$RANK or 0", "Logical global rank of this process."},
    {"PRISM_WORLD_SIZE", "$WORLD_SIZE or 1", "Logical world size (real + virtual ranks)."},
    {"PRISM_LOCAL_RANK", "$LOCAL_RANK or 0", "Logical local rank (the device ordinal the job selects)."},
    {"PRISM_GPUS_PER_NODE", "0",
     "Devices the job sees (cudaGetDeviceCount); every one maps to the physical GPU. 0: no virtualisation."},
    {"PRISM_PHYS_DEVICE", "0", "Physical ordinal (within CUDA_VISIBLE_DEVICES) that virtual devices map to."},
    {"PRISM_OUT_DIR", "", "Directory for rank<R>.events.jsonl (no event file when empty)."},
    {"PRISM_COORD_SOCKET", "", "Coordinator Unix socket: communicators with several real members use it."},
    {"PRISM_COORD_ADDR", "", "Coordinator TCP event bus HOST:PORT (used when PRISM_COORD_SOCKET is unset)."},
    {"PRISM_TOPOLOGY", "", "Cost-model topology (preset name, file or inline JSON); empty: built-in default."},
    {"PRISM_PAYLOAD", "mirror", "Data of virtual members: mirror | zeros | random | recorded."},
    {"PRISM_GATE", "wait",
     "How a stream is held: wait (cuStreamWaitValue32 on host memory), spin (a kernel with NCCL's CTA count), "
     "none (no hold: outputs only, for debugging)."},
    {"PRISM_ARRIVAL", "kernel",
     "How a collective's arrival is stamped on its stream: kernel (a kernel writes %globaltimer into host-mapped "
     "memory) or event (cuEventRecord, read against an anchor event of known %globaltimer; not under --swap and "
     "PRISM_KERNELS, which keep kernel stamps). docs/libprism.md \"Arrival stamps\" says which costs less where."},
    {"PRISM_FIXED_DUR_US", "", "Every operation lasts exactly this many microseconds (tests; overrides the model)."},
    {"PRISM_SEED", "1", "Seed of the random payload policy and of p2p fallbacks."},
    {"PRISM_SPIN_CTAS", "0", "CTAs of the spinning gate; 0: the cost model's channel count (16 without one)."},
    {"PRISM_REAL_RANKS", "$PRISM_RANK", "Global ranks run for real in this emulation, e.g. \"0,5,8-11\"."},
    {"PRISM_EXCHANGE", "1",
     "1: communicators with several real members move real data between them through the coordinator; 0: each "
     "real rank applies the payload policy on its own."},
    {"PRISM_SEND_RENDEZVOUS", "0",
     "1: a send to a real peer completes once the peer posted the receive (NCCL's rendezvous, on the host thread; "
     "needed to reproduce p2p deadlocks); 0: it completes when posted (the behaviour the GPU runs validated)."},
    {"PRISM_PASSTHROUGH", "1",
     "1: a communicator whose members are all real and each on its own GPU (the coordinator decides) runs on the "
     "real NCCL; 0: libprism handles it like any other (exchange or gate)."},
    {"PRISM_PASSTHROUGH_EVENTS", "1",
     "1: a passthrough operation (or group) gets GPU stamps before and after the real NCCL call and an op line in the "
     "event file (arrival and release on the GPU clock, \"passthrough\":1); 0: passthrough operations leave no trace."},
    {"PRISM_PASSTHROUGH_TIMEOUT_S", "600",
     "Seconds a member of a passthrough communicator waits for communicator rank 0's real NCCL unique id."},
    {"PRISM_NCCL_LIBRARY", "", "The real libnccl passthrough uses; empty: the one the job already loaded (PyTorch's)."},
    {"PRISM_GRAPH", "",
     "Set by prism-run --graph: every communicator takes its release times from the coordinator, which replays the "
     "virtual ranks from that graph."},
    {"PRISM_PAYLOAD_FILE", "", "Recorded payloads this rank replays under PRISM_PAYLOAD=recorded (written by collect)."},
    {"PRISM_RECORD_PAYLOADS", "", "File this rank appends every received payload to (collect --record-payloads)."},
    {"PRISM_PAYLOAD_MAX_BYTES", "4194304",
     "Recorded payloads larger than this many bytes are neither recorded nor replayed (mirror instead); 0: no limit."},
    {"PRISM_KERNELS", "0",
     "1: record the rank's kernels, memcpys and memsets with CUPTI into rank<R>.kernels.jsonl (prism-run --kernels); "
     "nvtx: also the job's NVTX ranges; 0: off (docs/kernels.md)."},
    {"PRISM_CUPTI_LIBRARY", "", "The libcupti PRISM_KERNELS uses; empty: searched (docs/kernels.md)."},
    {"PRISM_KERNELS_TOGGLE", "0",
     "N > 0 with PRISM_KERNELS: recording is on for iterations [0, N), off for [N, 2N), on again ... (switched at "
     "the iteration marks), to measure the recording's cost within one run; 0: on throughout."},
    {"PRISM_GATE_TOGGLE", "0",
     "N > 0: units are gated for iterations [0, N), not gated for [N, 2N) (as PRISM_GATE=none), gated again ... "
     "(switched at the iteration marks), to measure the gates' cost within one run (tests/gpu/overhead_toggle.sh: "
     "world 1, PRISM_FIXED_DUR_US=0.001); where virtual ranks decide releases the ungated blocks run ahead of them "
     "(docs/libprism.md \"Cost on a real rank\"). 0: gated throughout."},
};
const int kNumSettings = static_cast<int>(sizeof(kSettings) / sizeof(kSettings[0]));

namespace {

bool ParseInt(const char* s, long lo, long hi, int* out) {
  if (s == nullptr || *s == '\0') return false;
  errno = 0;
  char* end = nullptr;
  long v = std::strtol(s, &end, 10);
  if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi) return false;
  *out = static_cast<int>(v);
  return true;
}

void IntSetting(EnvLookup lookup, const char* name, const char* fallback_name, long lo, long hi, int* field,
                Config* c) {
  const char* v = lookup(name);
  const char* used = name;
  if ((v == nullptr || *v == '\0') && fallback_name != nullptr) {
    v = lookup(fallback_name);
    used = fallback_name;
  }
  if (v == nullptr || *v == '\0') return;
  if (!ParseInt(v, lo, hi, field)) {
    c->errors.push_back(std::string(used) + "='" + v + "' is not an integer in [" + std::to_string(lo) + ", " +
                        std::to_string(hi) + "]");
  }
}

}  // namespace

bool Config::IsReal(int global_rank) const {
  for (int r : real_ranks) {
    if (r == global_rank) return true;
  }
  return false;
}

bool ParseRankList(const std::string& text, std::vector<int>* out) {
  std::string error;
  auto r = prism::ParseRankList(text, 0, "PRISM_REAL_RANKS", &error);
  if (!r) return false;
  *out = std::move(*r);
  return true;
}

void LoadConfig(EnvLookup lookup, Config* c) {
  *c = Config();
  IntSetting(lookup, "PRISM_RANK", "RANK", 0, 1 << 30, &c->rank, c);
  IntSetting(lookup, "PRISM_WORLD_SIZE", "WORLD_SIZE", 1, 1 << 30, &c->world_size, c);
  IntSetting(lookup, "PRISM_LOCAL_RANK", "LOCAL_RANK", 0, 1 << 20, &c->local_rank, c);
  IntSetting(lookup, "PRISM_GPUS_PER_NODE", nullptr, 0, 1 << 16, &c->gpus_per_node, c);
  IntSetting(lookup, "PRISM_PHYS_DEVICE", nullptr, 0, 1 << 16, &c->phys_device, c);
  IntSetting(lookup, "PRISM_SPIN_CTAS", nullptr, 0, 4096, &c->spin_ctas, c);
  if (c->rank >= c->world_size) {
    c->errors.push_back("rank " + std::to_string(c->rank) + " is not below world size " +
                        std::to_string(c->world_size) + "; using rank 0");
    c->rank = 0;
  }
  if (c->gpus_per_node > 0 && c->local_rank >= c->gpus_per_node) {
    c->errors.push_back("PRISM_LOCAL_RANK " + std::to_string(c->local_rank) + " is not below PRISM_GPUS_PER_NODE " +
                        std::to_string(c->gpus_per_node));
  }
  if (const char* v = lookup("PRISM_OUT_DIR")) c->out_dir = v;
  if (const char* v = lookup("PRISM_COORD_SOCKET")) c->coord_socket = v;
  if (const char* v = lookup("PRISM_COORD_ADDR")) c->coord_addr = v;
  if (const char* v = lookup("PRISM_TOPOLOGY")) c->topology = v;
  if (const char* v = lookup("PRISM_PAYLOAD"); v && *v) c->payload = v;
  if (const char* v = lookup("PRISM_GATE"); v && *v) {
    if (std::strcmp(v, "wait") == 0) {
      c->gate = GateKind::kWait;
    } else if (std::strcmp(v, "spin") == 0) {
      c->gate = GateKind::kSpin;
    } else if (std::strcmp(v, "none") == 0) {
      c->gate = GateKind::kNone;
    } else {
      c->errors.push_back(std::string("PRISM_GATE='") + v + "' is not wait, spin or none; using wait");
    }
  }
  if (const char* v = lookup("PRISM_ARRIVAL"); v && *v) {
    if (std::strcmp(v, "event") == 0) c->arrival_by_event = true;
    else if (std::strcmp(v, "kernel") == 0) c->arrival_by_event = false;
    else c->errors.push_back(std::string("PRISM_ARRIVAL='") + v + "' is not kernel or event; using kernel");
  }
  if (const char* v = lookup("PRISM_FIXED_DUR_US"); v && *v) {
    char* end = nullptr;
    double d = std::strtod(v, &end);
    if (end == v || *end != '\0' || !(d >= 0.0) || d > 3.6e9) {
      c->errors.push_back(std::string("PRISM_FIXED_DUR_US='") + v + "' is not a duration in microseconds");
    } else {
      c->fixed_dur_us = d;
    }
  }
  if (const char* v = lookup("PRISM_SEED"); v && *v) {
    char* end = nullptr;
    errno = 0;
    unsigned long long s = std::strtoull(v, &end, 0);
    if (errno != 0 || end == v || *end != '\0') {
      c->errors.push_back(std::string("PRISM_SEED='") + v + "' is not an unsigned integer");
    } else {
      c->seed = s;
    }
  }
  if (const char* v = lookup("PRISM_REAL_RANKS"); v && *v) {
    std::vector<int> ranks;
    if (!ParseRankList(v, &ranks)) {
      c->errors.push_back(std::string("PRISM_REAL_RANKS='") + v + "' is not a rank list like 0,5,8-11");
    } else {
      c->real_ranks = ranks;
    }
  }
  if (c->real_ranks.empty()) c->real_ranks.push_back(c->rank);
  if (const char* v = lookup("PRISM_EXCHANGE"); v && *v) {
    if (std::string(v) == "0") c->exchange = false;
    else if (std::string(v) == "1") c->exchange = true;
    else c->errors.push_back(std::string("PRISM_EXCHANGE='") + v + "' is not 0 or 1");
  }
  if (const char* v = lookup("PRISM_PAYLOAD_FILE")) c->payload_file = v;
  if (const char* v = lookup("PRISM_GRAPH")) c->graph = v;
  if (const char* v = lookup("PRISM_SEND_RENDEZVOUS"); v && *v) {
    if (std::string(v) == "0") c->send_rendezvous = false;
    else if (std::string(v) == "1") c->send_rendezvous = true;
    else c->errors.push_back(std::string("PRISM_SEND_RENDEZVOUS='") + v + "' is not 0 or 1");
  }
  if (const char* v = lookup("PRISM_RECORD_PAYLOADS")) c->record_payloads = v;
  if (const char* v = lookup("PRISM_PAYLOAD_MAX_BYTES"); v && *v) {
    char* end = nullptr;
    errno = 0;
    unsigned long long n = std::strtoull(v, &end, 10);
    if (errno != 0 || end == v || *end != '\0' || !std::isdigit(static_cast<unsigned char>(*v))) {
      c->errors.push_back(std::string("PRISM_PAYLOAD_MAX_BYTES='") + v + "' is not a number of bytes");
    } else {
      c->payload_max_bytes = n;
    }
  }
  if (const char* v = lookup("PRISM_PASSTHROUGH"); v && *v) {
    if (std::string(v) == "0") c->passthrough = false;
    else if (std::string(v) == "1") c->passthrough = true;
    else c->errors.push_back(std::string("PRISM_PASSTHROUGH='") + v + "' is not 0 or 1");
  }
  IntSetting(lookup, "PRISM_PASSTHROUGH_TIMEOUT_S", nullptr, 1, 86400, &c->passthrough_timeout_s, c);
  if (const char* v = lookup("PRISM_GATE_OPEN_STAMPS"); v && *v) {
    if (std::string(v) == "0") c->gate_open_stamps = false;
    else if (std::string(v) == "1") c->gate_open_stamps = true;
    else c->errors.push_back(std::string("PRISM_GATE_OPEN_STAMPS='") + v + "' is not 0 or 1");
  }
  if (const char* v = lookup("PRISM_PASSTHROUGH_EVENTS"); v && *v) {
    if (std::string(v) == "0") c->passthrough_events = false;
    else if (std::string(v) == "1") c->passthrough_events = true;
    else c->errors.push_back(std::string("PRISM_PASSTHROUGH_EVENTS='") + v + "' is not 0 or 1");
  }
  if (const char* v = lookup("PRISM_KERNELS"); v && *v) {
    if (std::string(v) == "0") c->kernels = 0;
    else if (std::string(v) == "1") c->kernels = 1;
    else if (std::string(v) == "nvtx") c->kernels = 2;
    else c->errors.push_back(std::string("PRISM_KERNELS='") + v + "' is not 0, 1 or nvtx");
  }
  if (const char* v = lookup("PRISM_GATE_TOGGLE"); v && *v) {
    if (!ParseInt(v, 0, 1 << 20, &c->gate_toggle)) {
      c->errors.push_back(std::string("PRISM_GATE_TOGGLE='") + v + "' is not a number of iterations (0 or more)");
    }
  }
  if (const char* v = lookup("PRISM_KERNELS_TOGGLE"); v && *v) {
    if (!ParseInt(v, 0, 1 << 20, &c->kernels_toggle)) {
      c->errors.push_back(std::string("PRISM_KERNELS_TOGGLE='") + v + "' is not a number of iterations (0 or more)");
    }
  }
}

}  // namespace prism::interpose
