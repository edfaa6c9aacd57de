// The communicators the real ranks create: kCommInit -> kCommInfo (who the members are, found by the unique id the
// store saw, a registered group, the member's own list or the world size), whether a communicator passes through
// to the real NCCL, and the real NCCL unique id its members share (kRealNcclId). Under CoordinatorState::mu.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "coordinator/coordinator_state.h"

namespace prism::coord {

class CommRegistry {
 public:
  explicit CommRegistry(CoordinatorState& st) : st_(st) {}

  // comm_id - 1 -> view.
  const std::vector<CommView>& comms() const { return comms_; }
  // A kCommInit (`text_bytes`: its JSON's size): answered now, or parked until the store records a new id
  // (RetryParked) or its deadline passes. A client whose parked requests would pass the bus's max_parked_bytes is
  // marked to be dropped instead.
  void OnCommInit(BusId id, BusClient& c, nlohmann::json j, size_t text_bytes);
  // The loop's wake-up (`timer` false) or tick (true): parked requests are tried again; past their deadline,
  // answered with what is known.
  void RetryParked(bool timer);
  void OnRealNcclId(BusId id, BusClient& c, const nlohmann::json& j);

 private:
  // Answers a kCommInit; false (nothing sent) when the members are unknown and `final` is false.
  bool HandleCommInit(BusId id, BusClient& c, const nlohmann::json& j, bool final);
  // HandleCommInit's steps (comm_registry.cc).
  struct CommInitRequest;
  void FindMembers(const nlohmann::json& j, CommInitRequest* q);
  std::string Problem(const BusClient& c, const CommInitRequest& q) const;
  void Refuse(BusId id, const BusClient& c, const CommInitRequest& q, const std::string& problem);
  std::optional<uint32_t> FindOrAddComm(const CommInitRequest& q, bool final);
  uint32_t AddComm(const CommInitRequest& q, bool passthrough);
  void AddHangComm(uint32_t comm_id, const CommInitRequest& q, std::vector<bool> is_real);
  void SendCommInfo(BusId id, const CommInitRequest& q, uint32_t comm_id);
  // Whether a new communicator with these members runs on the real NCCL; nullopt while a real member has not said
  // hello yet (its GPU is unknown) and `final` is false.
  std::optional<bool> DecidePassthrough(const std::vector<int>& members, bool final);

  CoordinatorState& st_;
  std::vector<CommView> comms_;
  std::unordered_map<std::string, uint32_t> comm_by_key_;
  std::unordered_map<std::string, uint32_t> comm_by_id_;  // unique-id hex (kCommInit "key") -> comm id
  struct Parked {
    BusId id;
    nlohmann::json request;
    uint64_t bytes;  // counted in the client's BusClient::parked_bytes
    std::chrono::steady_clock::time_point deadline;
  };
  // Why park: a leader's SET of its id (store, TCP) and its kCommInit (bus) race; the SET has no reply.
  std::vector<Parked> parked_;
  std::map<uint32_t, std::vector<BusId>> real_id_waiters_;  // passthrough comm -> members asking for its id
};

}  // namespace prism::coord
