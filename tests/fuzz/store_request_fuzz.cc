// Fuzzes what a TCPStore server does with arbitrary client bytes: the incremental request parser, then the store's
// handling of whatever parses (waits across clients, queues, counters, virtual-rank stand-ins), as StoreServer
// drives them, without sockets. Input: a sequence of chunks [selector byte][length byte][bytes...]; the selector
// picks one of four clients, so requests arrive split and interleaved the way a network delivers them.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "coordinator/store/store_protocol.h"
#include "coordinator/store/store_state.h"
#include "coordinator/store/virtual_ranks.h"

namespace {

struct Client {
  std::string in;
  bool validated = false;
};

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("PRISM_LOG_LEVEL", "off", 1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace prism;
  coord::VirtualRanksOptions vo;
  vo.world_size = 16;
  vo.real_ranks = {0, 3};
  vo.ranks_per_root = 4;
  coord::VirtualRanks vr(vo);
  size_t delivered = 0;
  store::StoreState state([&](store::ClientId, std::string_view b) { delivered += b.size(); }, &vr,
                          /*max_total_bytes=*/1 << 20);
  store::Limits limits;
  limits.max_request_bytes = 1 << 20;
  Client clients[4];
  size_t pos = 0;
  while (pos + 2 <= size) {
    unsigned sel = data[pos] & 3u;
    size_t len = data[pos + 1];
    pos += 2;
    if (len > size - pos) len = size - pos;
    Client& c = clients[sel];
    c.in.append(reinterpret_cast<const char*>(data + pos), len);
    pos += len;
    size_t off = 0;
    for (;;) {
      store::Request req;
      size_t consumed = 0;
      std::string error, reply;
      auto st = store::ParseRequest(reinterpret_cast<const uint8_t*>(c.in.data()) + off, c.in.size() - off, limits,
                                    &req, &consumed, &error);
      if (st == store::ParseStatus::kNeedMore) break;
      // Why the fuzzer may skip VALIDATE: the state must hold up whatever the server's gate lets through.
      bool ok = st == store::ParseStatus::kOk && state.Handle(sel, req, &reply, &error);
      if (!ok) {
        state.DropClient(sel);
        c = Client{};
        off = 0;
        break;
      }
      if (consumed == 0) std::abort();  // a parsed request always consumes bytes
      off += consumed;
    }
    if (off) c.in.erase(0, off);
  }
  state.RetryWaits();
  (void)state.Stats();
  (void)state.WaitedKeys(8);
  return 0;
}
