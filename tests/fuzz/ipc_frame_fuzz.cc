// Fuzzes the ipc.h frame decoder (src/common/ipc_io.h) with arbitrary bytes fed in arbitrary splits: it must never
// read out of bounds, never return a frame longer than the limit, and stay failed once it failed.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "common/ipc_io.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace prism::ipc;
  if (size == 0) return 0;
  size_t step = 1 + data[0] % 64;
  FrameDecoder d(1 << 16);
  bool failed = false;
  for (size_t pos = 1; pos < size; pos += step) {
    size_t n = step < size - pos ? step : size - pos;
    d.Feed(data + pos, n);
    Frame f;
    for (;;) {
      DecodeStatus st = d.Next(&f);
      if (st == DecodeStatus::kNeedMore) break;
      if (st == DecodeStatus::kError) {
        failed = true;
        break;
      }
      if (failed || f.payload.size() > (1u << 16) || f.type == MsgType::kInvalid) std::abort();
    }
    if (failed && d.Next(&f) != DecodeStatus::kError) std::abort();
  }
  std::string hex = HexEncode(std::string_view(reinterpret_cast<const char*>(data), size)), back;
  if (!HexDecode(hex, &back) || back.size() != size) std::abort();
  int writer = 0;
  (void)IsVirtualNcclId(data, size, &writer);
  return 0;
}
