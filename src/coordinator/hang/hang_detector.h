// Hang diagnosis: the coordinator feeds every real rank's arrivals, releases, op records and iteration marks into a
// HangDetector; when no real rank made progress for `timeout_s` while some wait, Check() returns a diagnosis:
// collectives whose members disagree at one sequence, real members that never arrived, p2p wait-for cycles, and
// the chain from each waiting real rank to the rank that holds it up. Pure bookkeeping: no locks, no I/O, no clock
// of its own (every call takes now_ns), so tests drive it with a fake clock.
//
// Virtual members are taken to be where their real counterparts are (payload "mirror": the shim completes them
// with the real ranks), so only real members can hold an operation up.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "prism/ipc.h"

namespace prism::coord {

// What one rank issued at (comm, seq).
struct HangOp {
  uint32_t comm_id = 0;
  uint64_t seq = 0;
  uint32_t op = 0;      // prism::trace::CollOp, or 100 + NodeKind (103 send, 104 recv)
  uint64_t bytes = 0;
  int dtype = -1;       // prism::trace::DType; -1 unknown (kOpArrive carries none, kOpRecord does)
  int peer = -1;        // p2p peer, global rank (-1: collective or unknown)
  uint64_t since_ns = 0;
};

// Where one real rank is on one communicator: the last operation it completed and the one it waits at.
struct HangPosition {
  std::optional<HangOp> done;     // since_ns: when the coordinator learned it completed
  std::optional<HangOp> pending;  // since_ns: when it arrived (only communicators with several real members)
};

// One operation in a real rank's log (the last kLogSize per rank), oldest first: what a Flight Recorder entry holds.
struct HangLogEntry {
  uint64_t id = 0;            // per rank, from 0
  // Counters per (rank, torch process group) as Flight Recorder numbers them: collectives (1-based, the value of
  // this entry when it is a collective), p2p operations (likewise), every operation of the rank.
  uint64_t pg_coll_seq = 0, pg_p2p_seq = 0;
  HangOp op;
  uint64_t created_ns = 0;    // arrival (the GPU reached it), coordinator's or shim's clock (Unix epoch ns)
  uint64_t completed_ns = 0;  // release; 0 while not completed
  uint64_t duration_ns = 0;   // release - arrival as the shim reported it; 0 unknown
};

struct HangComm {
  std::string name;          // for messages: group description, "group <name>", or ""
  std::string pg_name;       // torch process-group name ("0" for the default group), "" unknown
  std::string pg_desc;       // torch group description ("default_pg", Megatron's group name), "" unknown
  std::vector<int> members;  // global ranks, communicator-rank order
  std::vector<bool> real;
  std::vector<int> pg_members;  // the process group's members (a p2p communicator's group is larger); empty unknown
};

struct HangMismatch {
  uint32_t comm_id = 0;
  std::string comm_name;
  uint64_t seq = 0;
  std::string what;                          // "op", "size", "dtype", "p2p direction" (comma-joined if several)
  std::vector<std::pair<int, HangOp>> ops;   // global rank -> what it issued there
};

struct HangMissing {
  uint32_t comm_id = 0;
  std::string comm_name;
  uint64_t seq = 0;
  std::vector<int> arrived;  // real members waiting there
  // real members that never arrived: (rank, the last sequence it reached on this comm, -1 none)
  std::vector<std::pair<int, int64_t>> missing;
};

struct HangWait {
  int rank = -1;
  HangOp op;
  std::vector<int> blocked_by;  // real ranks it waits for
  std::vector<std::string> chain;  // one hop per line, ends at the rank that holds it up (or a cycle)
  int held_up_by = -1;            // the last rank of the chain
};

// What differs between operations issued at one (comm, seq): "op", "size", "dtype", "p2p direction" (comma-joined,
// sorted), "" when they agree. `pair`: the communicator has two members, so p2p sides must pair up (a send with a
// recv of the same size). Grouped units (op 0) are never compared. Used by Diagnose and by the coordinator, which
// holds a collective whose real members all arrived but disagree instead of releasing it.
std::string Disagreement(const std::vector<std::pair<int, HangOp>>& ops, bool pair);

struct HangDiagnosis {
  std::string header;     // first line of ToText; empty: "no real rank made progress for ..."
  uint64_t t_ns = 0;
  double stalled_s = 0;   // since the last progress of any real rank
  double timeout_s = 0;
  std::vector<HangWait> waits;
  std::vector<HangMismatch> mismatches;
  std::vector<HangMissing> missing;
  std::vector<std::vector<int>> cycles;  // p2p/collective wait-for cycles, smallest rank first
  // (comm, seq) the coordinator holds because its real members all arrived but disagree (what differs).
  std::vector<std::pair<std::pair<uint32_t, uint64_t>, std::string>> held;

  std::string ToJson() const;  // what <out>/hang.json holds
  // What is printed; at most `max_chains` waiting ranks' chains (the rest are counted).
  std::string ToText(size_t max_chains = 64) const;
};

// The ranks to run for real to reproduce a diagnosis under prism, each with why: of every disagreement one rank per
// distinct operation (the smallest), the members that never arrived plus one that waits for them, every rank of a
// wait-for cycle, and the rank each chain ends at plus one rank it holds up. Sorted, without repeats.
std::vector<std::pair<int, std::string>> ReproduceRanks(const HangDiagnosis& d);

class HangDetector {
 public:
  explicit HangDetector(double timeout_s = 60.0) : timeout_s_(timeout_s) {}

  void set_timeout(double s) { timeout_s_ = s; }
  double timeout() const { return timeout_s_; }

  static constexpr size_t kLogSize = 2000;  // Why 2000: torch's Flight Recorder default (TORCH_FR_BUFFER_SIZE)

  // A communicator: members in communicator-rank order, which of them run for real, a name for messages, and the
  // torch process group it belongs to when known.
  void AddComm(uint32_t comm_id, std::string name, std::vector<int> members, std::vector<bool> real,
               std::string pg_name = {}, std::string pg_desc = {});
  void AddComm(uint32_t comm_id, HangComm comm);
  // The real members of (comm, seq) all arrived but disagree (`what`); the coordinator holds the operation.
  void Hold(uint32_t comm_id, uint64_t seq, std::string what);
  void Arrive(int rank, const ipc::OpArrive& a, uint64_t now_ns);
  void Release(int rank, uint32_t comm_id, uint64_t seq, uint64_t now_ns);
  void Record(int rank, const ipc::OpRecord& r, uint64_t now_ns);
  // The same from a HangOp (peer as a global rank, dtype when known): Flight Recorder input, tests.
  void ArriveOp(int rank, HangOp op, uint64_t created_ns, uint64_t now_ns);
  void RecordOp(int rank, HangOp op, uint64_t arrival_ns, uint64_t release_ns, uint64_t now_ns);
  // An operation the rank issued behind the one it waits at (Flight Recorder input): known, not waited at.
  void Issue(int rank, const HangOp& op, uint64_t now_ns);
  void Progress(int rank, uint64_t now_ns);  // an iteration mark
  void SetState(int rank, const std::string& state);  // "lost", "bye": named in the chain

  // A diagnosis the first time the stall condition holds (timeout passed, some real rank waiting); nothing again
  // until progress resumes and stalls anew. timeout <= 0: never.
  std::optional<HangDiagnosis> Check(uint64_t now_ns);
  // The diagnosis as things stand (no timeout check).
  HangDiagnosis Diagnose(uint64_t now_ns) const;
  // "comm 3 (DATA_PARALLEL_GROUP)", or "comm 3" when the communicator has no name.
  std::string CommName(uint32_t comm_id) const;

  const std::map<uint32_t, HangComm>& comms() const { return comms_; }
  // Per real rank that reported anything: per communicator, its position.
  std::map<int, std::map<uint32_t, HangPosition>> Positions() const;
  // The operation log of one rank (empty when unknown).
  const std::deque<HangLogEntry>& Log(int rank) const;
  std::vector<int> Ranks() const;  // ranks with a log or a state
  const std::string& State(int rank) const;  // "", "lost", "bye"
  uint64_t LastProgress(int rank) const;

 private:
  using Comm = HangComm;
  struct Rank {
    uint64_t last_progress_ns = 0;
    std::optional<HangOp> pending;
    std::map<uint32_t, int64_t> reached;  // comm -> highest sequence arrived at or completed
    std::map<uint32_t, HangPosition> at;  // comm -> position
    std::deque<HangLogEntry> log;
    uint64_t next_log_id = 0;
    std::map<std::string, std::pair<uint64_t, uint64_t>> pg_counts;  // process group -> (collectives, p2p)
    std::string state;
  };
  HangLogEntry& LogEntry(Rank& r, const HangOp& op, uint64_t created_ns);

  void Note(int rank, const HangOp& op, uint64_t now_ns, bool progress = true);
  std::vector<int> Blockers(int rank, const HangOp& op) const;
  class Diagnoser;  // Diagnose's steps (hang_detector.cc)

  double timeout_s_;
  std::map<uint32_t, Comm> comms_;
  std::map<int, Rank> ranks_;
  std::map<std::pair<uint32_t, uint64_t>, std::string> held_;
  // (comm, seq) -> rank -> what it issued; the last kHistory sequences per comm.
  std::map<std::pair<uint32_t, uint64_t>, std::map<int, HangOp>> history_;
  uint64_t last_progress_ns_ = 0;
  bool reported_ = false;
};

std::string HangOpName(uint32_t op);
// Ranks for people: sorted, runs "0-7", strided runs "5,21..1013 (step 16)", others "3,9".
std::string RankListText(std::vector<int> ranks);
// The same, or "960 ranks: 0-4,6-20,..." when longer than max_chars.
std::string RankListShort(const std::vector<int>& ranks, size_t max_chars = 96);
// status.json's view of the detector: "communicators" [{comm, name, pg_name, pg_desc, size, members, real}] and
// "positions" [{rank, state, last_progress_ns, comms [{comm, done {seq, op, bytes, dtype, t_ns}, pending {seq, op,
// bytes, dtype, peer, since_ns}}]}] (docs/hang.md).
void AddPositions(const HangDetector& d, nlohmann::json* status);
// "all_reduce 1 MiB", "send 4 KiB to rank 5", with the dtype when known.
std::string HangOpText(const HangOp& op);

}  // namespace prism::coord
