// P2pSendHistory: this rank's recent sends per communicator, for the mirror rule of p2p receives.
#include <initializer_list>
#include <new>

#include "nccl_patch/dtype_math.h"
#include "nccl_patch/semantics.h"

namespace prism::payload {
namespace {

uint32_t SlotOf(int32_t peer, uint64_t bytes) {
  const uint64_t h = math::Mix64(bytes * math::kGolden ^ static_cast<uint64_t>(static_cast<uint32_t>(peer)));
  return static_cast<uint32_t>(h & (P2pSendHistory::kSlots - 1u));
}

}  // namespace

P2pSendHistory::~P2pSendHistory() {
  delete[] by_peer_;
  delete[] by_size_;
}

bool P2pSendHistory::RecordSend(int32_t peer, uint64_t bytes, uint64_t addr) {
  if (bytes == 0 || addr == 0) return true;  // nothing a recv could copy
  if (by_peer_ == nullptr) {
    // Why lazily: most communicators never see a send; they pay nothing.
    by_peer_ = new (std::nothrow) Entry[kSlots];
    by_size_ = new (std::nothrow) Entry[kSlots];
    if (by_peer_ == nullptr || by_size_ == nullptr) {
      delete[] by_peer_;
      delete[] by_size_;
      by_peer_ = by_size_ = nullptr;
      return false;
    }
  }
  by_peer_[SlotOf(peer, bytes)] = Entry{bytes, addr, peer};
  by_size_[SlotOf(-1, bytes)] = Entry{bytes, addr, peer};
  return true;
}

bool P2pSendHistory::Find(int32_t peer, uint64_t bytes, uint64_t* addr) const {
  if (addr != nullptr) *addr = 0;
  if (by_peer_ == nullptr || bytes == 0) return false;
  const Entry& p = by_peer_[SlotOf(peer, bytes)];
  const Entry* hit = (p.bytes == bytes && p.peer == peer) ? &p : nullptr;
  if (hit == nullptr) {
    const Entry& s = by_size_[SlotOf(-1, bytes)];
    if (s.bytes == bytes) hit = &s;
  }
  if (hit == nullptr) return false;
  if (addr != nullptr) *addr = hit->addr;
  return true;
}

void P2pSendHistory::InvalidateRange(uint64_t addr, uint64_t bytes) {
  if (by_peer_ == nullptr || bytes == 0) return;
  const uint64_t end = addr + bytes;
  for (Entry* table : {by_peer_, by_size_}) {
    for (uint32_t i = 0; i < kSlots; ++i) {
      Entry& e = table[i];
      if (e.bytes != 0 && e.addr < end && addr < e.addr + e.bytes) e = Entry{};
    }
  }
}

}  // namespace prism::payload
