// Communicators are libprism's own structs: size, rank, the members' global ranks when known (and which are
// real), a per-communicator sequence, the cost-model tables, the p2p send history of the mirror policy and
// PreMulSum operators. No NCCL state exists anywhere: a communicator costs no GPU memory, so emulating 8192 ranks
// costs a real rank what emulating 8 does.
//
// Members are learnt, in this order: a communicator as large as the world is the world; the Python hook's
// scope around new_group (eager/split creation); the group name in the NCCL unique id written by the
// coordinator for a virtual leader ("PRISMVID", src/common/ipc_io.h) or in ncclConfig_t::commName; the
// coordinator's kCommInfo; a unique match among groups the hook registered (same size, this rank at this
// position). Otherwise they stay unknown (fine for the mirror policy; logged).
#pragma once

#include <nccl.h>

#include <atomic>
#include <map>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "interpose/core/cost.h"
#include "nccl_patch/semantics.h"

namespace prism::interpose {

struct PreMulSumOp {
  bool used = false;
  payload::DataType dtype = payload::DataType::kFloat32;
  uint64_t bits = 0;  // ncclScalarHostImmediate: the scalar's bytes
  uint64_t addr = 0;  // ncclScalarDevice: its device address
};

struct Comm {
  static constexpr uint64_t kMagic = 0x4d4d4f434d535250ull;  // "PRSMCOMM"
  uint64_t magic = kMagic;
  uint32_t id = 0;            // process-local id (event file)
  uint64_t stable_id = 0;     // the same on every rank of the communicator (payload seeds)
  int nranks = 1;
  int rank = 0;
  int device = 0;             // virtual device current at creation (ncclCommCuDevice)
  std::vector<int32_t> members;  // global ranks in communicator-rank order; empty when unknown
  int real_members = 1;
  std::vector<uint8_t> member_real;  // per communicator rank: 1 when that member runs for real (members known)
  bool use_coordinator = false;
  uint32_t coord_comm_id = 0;
  // Passthrough: every member is real and on its own GPU (the coordinator said so, or the parent was real): `real`
  // is a real NCCL communicator among them and every operation goes to the real NCCL (real_symbols.h).
  ncclComm_t real = nullptr;
  std::string key;            // store key of the unique id when known, else a hex prefix of the id
  std::string desc;           // torch group description when known
  std::string name;           // torch group name when known
  std::string origin;         // init | split | shrink | initall
  int blocking = 1;
  std::atomic<int> async_error{ncclSuccess};
  std::atomic<bool> finalized{false};
  std::atomic<bool> destroyed{false};
  std::atomic<bool> revoked{false};
  std::atomic<uint64_t> seq{0};
  std::atomic<uint32_t> splits{0};
  std::shared_ptr<CommCostState> cost;
  int spin_ctas = 16;
  std::mutex mu;  // history, redops, members updates
  payload::P2pSendHistory history;
  std::vector<PreMulSumOp> redops;
  // Exchange keys (ipc.h ExchangeHeader::key), under mu: collectives exchanged so far; p2p per peer.
  uint64_t xcoll = 0;
  std::map<int32_t, uint64_t> xsend, xrecv;

  int32_t GlobalRank(int comm_rank) const;  // -1 when unknown
};

// The communicator behind a handle, or nullptr when the handle is not a live libprism communicator.
Comm* ToComm(ncclComm_t handle);

ncclResult_t GetUniqueId(ncclUniqueId* out);

struct InitArgs {
  int nranks = 0;
  int rank = 0;
  const ncclUniqueId* ids = nullptr;
  int nids = 1;
  const ncclConfig_t* config = nullptr;
  const char* origin = "init";
};
ncclResult_t CommInit(const InitArgs& args, Comm** out);
ncclResult_t CommInitAll(ncclComm_t* comms, int ndev, const int* devlist);
ncclResult_t CommSplit(Comm* parent, int color, int key, ncclComm_t* out, const ncclConfig_t* config);
ncclResult_t CommShrink(Comm* parent, const int* exclude, int nexclude, ncclComm_t* out, const ncclConfig_t* config,
                        int flags);
ncclResult_t CommFinalize(Comm* c);
ncclResult_t CommDestroy(Comm* c);
ncclResult_t CommAbort(Comm* c);
ncclResult_t CommRevoke(Comm* c, int flags);
ncclResult_t CommGetAsyncError(Comm* c, ncclResult_t* out);
// Live passthrough communicators in this process (submit.cc forwards ncclGroupStart/End to the real NCCL while
// there are any).
int PassthroughComms();

// Python hook: the members of a torch process group (global ranks in group-rank order), after new_group /
// init_process_group returned. Binds communicators created inside the matching scope or named after the group.
void RegisterGroup(const std::string& name, const std::vector<int32_t>& ranks, const std::string& desc);
// Python hook: new_group(ranks) is about to run on this thread; communicators created before RegisterGroup (or
// EndGroupScope) on this thread belong to it.
void BeginGroupScope(const std::vector<int32_t>& ranks);
void EndGroupScope();

// Forgets p2p sends from freed memory in every communicator (memory.cc).
void InvalidateP2pRange(uint64_t addr, uint64_t bytes);

// Thread's last error message (ncclGetLastError).
const char* LastError();
void SetLastError(const std::string& what);

// Pure helpers (unit tests).
std::string GroupNameFromStoreKey(std::string_view key);   // "/default_pg/3//cuda//0" -> "3"
std::string GroupNameFromCommName(std::string_view name);  // "TENSOR_MODEL_PARALLEL_GROUP:3" -> "3", "3" -> "3"
std::string StoreKeyFromVirtualId(const ncclUniqueId& id); // "" unless the id is a coordinator's PRISMVID
uint64_t Fnv1a64(const void* data, size_t len, uint64_t h = 0xcbf29ce484222325ull);
// Every live communicator (event log, tests).
std::vector<Comm*> AllComms();

}  // namespace prism::interpose
