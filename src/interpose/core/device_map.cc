#include "interpose/core/device_map.h"

#include <atomic>

#include "interpose/core/config.h"

namespace prism::interpose::devices {
namespace {

thread_local int tls_device = -1;

constexpr int kPeerTracked = 64;
std::atomic<uint64_t> g_peer_enabled[kPeerTracked];

}  // namespace

bool Virtualized() { return Cfg().gpus_per_node > 0; }

int Count() { return Cfg().gpus_per_node; }

int Physical() { return Cfg().phys_device; }

bool Valid(int v) { return v >= 0 && v < Count(); }

int Current() { return tls_device >= 0 ? tls_device : 0; }

void SetCurrent(int v) { tls_device = v; }

bool SetPeerAccess(int device, int peer, bool enable) {
  if (device < 0 || device >= kPeerTracked || peer < 0 || peer >= kPeerTracked) return true;
  const uint64_t bit = uint64_t{1} << peer;
  uint64_t prev = enable ? g_peer_enabled[device].fetch_or(bit) : g_peer_enabled[device].fetch_and(~bit);
  return enable ? (prev & bit) == 0 : (prev & bit) != 0;
}

}  // namespace prism::interpose::devices
