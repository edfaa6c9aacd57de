// The coordinator's side of real data between real members (ipc.h kOpData/kOpResult, semantics in
// src/nccl_patch/exchange.h): assembles each real member's input, computes every real member's output once all
// real members of a collective sent theirs, and hands p2p bytes from a real sender to a real receiver. A send is
// acknowledged (kExchangeSendDone) only once its receive was posted, so a real send waits for its receiver as in
// NCCL. It also says who waits on what (Wait), which the coordinator feeds into the hang diagnosis.
// Pure logic on bytes (no sockets): the coordinator feeds frames in and sends the frames it gets back.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "nccl_patch/exchange.h"
#include "prism/ipc.h"
#include "prism/limits.h"

namespace prism::coord {

class ExchangeHub {
 public:
  // Encoded frames (ipc::EncodeFrame) for one global rank.
  struct Outgoing {
    int rank = -1;
    std::string frames;
  };

  // A real rank that starts (begin) or stops waiting in an exchange: a send whose receive was not posted yet, a
  // receive whose send was not posted yet, a collective whose other real members have not sent their input yet.
  // What the hang diagnosis needs to see that rank as waiting at (comm_id, seq) for `peer` (p2p) or for the real
  // members that have not arrived at that sequence (collectives).
  struct Wait {
    bool begin = true;   // false: the wait ended (the answer went out)
    int rank = -1;       // global rank that waits
    uint32_t comm_id = 0;
    uint64_t seq = 0;    // the operation's per-communicator sequence on that rank (ExchangeHeader::seq, widened)
    uint32_t op = 0;     // ipc.h OpArrive op code: prism::trace::CollOp, 103 send, 104 recv (0 unknown)
    uint64_t bytes = 0;  // as kOpArrive counts them (count x element size, x members for gathers/scatters)
    int peer = -1;       // p2p: the peer's global rank; -1 for collectives
  };

  // `max_held_bytes`: what the hub holds for one rank at most (HeldBytes); `max_result_bytes`: the largest result
  // it computes for a member (larger ones are answered with kExchangeError). Tests lower them.
  explicit ExchangeHub(uint64_t max_held_bytes = limits::kMaxExchangeHeldBytes,
                       uint64_t max_result_bytes = limits::kMaxBusQueuedBytes)
      : max_held_(max_held_bytes), max_result_(max_result_bytes) {}

  // `members`: global ranks in communicator-rank order; `real`: which of them run for real.
  void AddComm(uint32_t comm_id, std::vector<int> members, std::vector<bool> real);

  // One kOpData frame from real global rank `from`. Appends what must be sent to `out` and, when `waits` is given,
  // the waits that began or ended. Returns "" or a reason: the frame was refused (its sender is answered with
  // kExchangeError, and kExchangeSendDone for a send, so it does not wait forever), or the members of a collective
  // disagreed (each got kExchangeError). The caller logs the reason. *over_cap (when given) is set when the frame
  // was refused because `from` would hold more than max_held_bytes in the hub: the caller drops it.
  std::string OnData(int from, const ipc::ExchangeHeader& h, std::string_view bytes, std::vector<Outgoing>* out,
                     std::vector<Wait>* waits = nullptr, bool* over_cap = nullptr);
  // `rank`'s connection is gone: its inputs being assembled are dropped (a new connection starts them again at
  // offset 0). What it posted whole stays for its peers.
  void ForgetRank(int rank);
  // Bytes held for `rank` (inputs being assembled, posted inputs and sends not yet taken), for the cap and tests.
  uint64_t HeldBytes(int rank) const;

  // Operations waiting for real members (collectives), for a send (p2p receives), for a receive (sends, buffered
  // and not acknowledged yet); for status and tests.
  size_t PendingCollectives() const { return colls_.size(); }
  size_t PendingReceives() const { return recv_waits_.size(); }
  size_t BufferedSends() const { return sends_.size(); }
  // Every wait in progress (begin = true), by communicator: collectives, then sends, then receives.
  std::vector<Wait> Waits() const;
  uint64_t BytesIn() const { return bytes_in_; }

  // Hands an Outgoing's frames back once they were sent (or copied): large buffers are kept (at most
  // kPooledMaxBytes in all) and reused for the next inputs and results, so a 256 MiB all-reduce does not map and
  // fault in fresh pages for every buffer on every call (measured: bench/exchange_bench.cc, docs/payload.md).
  void Recycle(std::string&& frames);
  static constexpr uint64_t kPooledMin = 1u << 20;
  static constexpr uint64_t kPooledMaxBytes = uint64_t{2} << 30;

 private:
  struct CommInfo {
    std::vector<int> members;
    std::vector<bool> real;
    int real_count = 0;
  };
  // A complete kOpData as posted: its header, the sender's sequence widened to 64 bits, its bytes.
  struct Posted {
    ipc::ExchangeHeader h{};
    int from = -1;  // the global rank that posted it (-1: an empty slot)
    uint64_t seq = 0;
    std::string bytes;
  };
  struct Coll {
    ipc::ExchangeHeader first{};
    std::map<int32_t, Posted> inputs;  // comm rank -> complete input
    bool mismatch = false;
    std::string why;
  };
  using PartKey = std::tuple<int, uint32_t, uint64_t, int32_t, int32_t, uint32_t>;  // from, comm, key, rank, peer, flags
  using P2pKey = std::tuple<uint32_t, int32_t, int32_t, uint64_t>;                  // comm, src, dst, k

  // Returns "" or why a member's result was refused.
  std::string FinishCollective(uint32_t comm_id, uint64_t key, Coll& c, std::vector<Outgoing>* out);
  void Release(Posted&& p);              // no longer held: uncounted, its buffer kept for reuse
  void Store(Posted* slot, Posted&& p);  // into a map's slot, releasing what a repeated post replaces
  void ForgetPartial(const PartKey& pk);
  static void AppendResult(const ipc::ExchangeHeader& base, uint32_t flags, std::string_view bytes, std::string* to);
  // kOpResult frames of member `rank`'s output (`bytes` long, ExchangePlanOutput said kData), computed in place.
  bool AppendComputed(const ipc::ExchangeHeader& base, const payload::ExchangeOp& op,
                      const std::vector<const uint8_t*>& inputs, int32_t rank, uint64_t bytes, std::string* to);
  // Sets rank and seq in every exchange header of `frames` (a copy of another member's shared result).
  static void PatchResultHeaders(int32_t rank, uint32_t seq, std::string* frames);
  std::string TakeBuffer(uint64_t bytes);  // empty, capacity >= bytes; a spare one when large
  void GiveBuffer(std::string&& s);
  // The wait of the rank that posted `p`: a send's source, a receive's destination, a collective's member.
  Wait WaitOf(const CommInfo& comm, const Posted& p, bool begin) const;
  uint64_t WidenSeq(int from, uint32_t comm_id, uint32_t low);

  std::map<uint32_t, CommInfo> comms_;
  struct Partial {
    std::string bytes;   // reserved whole: growing by doubling would copy it again and again
    uint64_t total = 0;  // what the first chunk's header said, counted in held_ from then on
  };
  std::map<PartKey, Partial> partial_;
  std::map<int, uint64_t> held_;  // global rank -> bytes held for it
  uint64_t max_held_, max_result_;
  std::map<std::pair<uint32_t, uint64_t>, Coll> colls_;
  std::map<P2pKey, Posted> sends_;       // buffered sends: not acknowledged until their receive is posted
  std::map<P2pKey, Posted> recv_waits_;  // receive requests (no bytes) waiting for their send
  std::map<std::pair<int, uint32_t>, uint64_t> last_seq_;  // (global rank, comm) -> highest widened sequence
  uint64_t bytes_in_ = 0;
  std::vector<std::string> spare_;  // recycled large buffers (TakeBuffer / GiveBuffer)
  uint64_t spare_bytes_ = 0;
};

}  // namespace prism::coord
