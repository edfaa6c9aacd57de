// The coordinator's side of real data between real members (ipc.h kOpData/kOpResult, semantics in
// src/nccl_patch/exchange.h): assembles each real member's input, computes every real member's output once all
// real members of a collective sent theirs, and hands p2p bytes from a real sender to a real receiver.
// Pure logic on bytes (no sockets): the coordinator feeds frames in and sends the frames it gets back.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "prism/ipc.h"

namespace prism::coord {

class ExchangeHub {
 public:
  // Encoded frames (ipc::EncodeFrame) for one global rank.
  struct Outgoing {
    int rank = -1;
    std::string frames;
  };

  // `members`: global ranks in communicator-rank order; `real`: which of them run for real.
  void AddComm(uint32_t comm_id, std::vector<int> members, std::vector<bool> real);

  // One kOpData frame from real global rank `from`. Appends what must be sent to `out`. Returns "" or a reason the
  // frame was refused (logged by the caller; the sender is then answered with kExchangeError where possible).
  std::string OnData(int from, const ipc::ExchangeHeader& h, std::string_view bytes, std::vector<Outgoing>* out);

  // Operations waiting for real members (collectives) or for a send (p2p receives); for status and tests.
  size_t PendingCollectives() const { return colls_.size(); }
  size_t PendingReceives() const { return recv_waits_.size(); }
  size_t BufferedSends() const { return sends_.size(); }
  uint64_t BytesIn() const { return bytes_in_; }

 private:
  struct CommInfo {
    std::vector<int> members;
    std::vector<bool> real;
    int real_count = 0;
  };
  struct Coll {
    ipc::ExchangeHeader first{};
    std::map<int32_t, std::string> inputs;  // comm rank -> complete input
    bool mismatch = false;
    std::string why;
  };
  using PartKey = std::tuple<int, uint32_t, uint64_t, int32_t, int32_t, uint32_t>;  // from, comm, key, rank, peer, flags
  using P2pKey = std::tuple<uint32_t, int32_t, int32_t, uint64_t>;                  // comm, src, dst, k

  void FinishCollective(uint32_t comm_id, uint64_t key, Coll& c, std::vector<Outgoing>* out);
  static void AppendResult(const ipc::ExchangeHeader& base, uint32_t flags, std::string_view bytes, std::string* to);

  std::map<uint32_t, CommInfo> comms_;
  std::map<PartKey, std::string> partial_;
  std::map<std::pair<uint32_t, uint64_t>, Coll> colls_;
  std::map<P2pKey, std::string> sends_;
  std::map<P2pKey, ipc::ExchangeHeader> recv_waits_;
  uint64_t bytes_in_ = 0;
};

}  // namespace prism::coord
