// Frame encode/decode and blocking socket helpers for include/prism/ipc.h. Used by the coordinator and by
// libprism.so inside the user's process: no exceptions thrown on purpose, errors come back as codes and strings,
// no logging, no CUDA.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>

#include "prism/ipc.h"

namespace prism::ipc {

struct Frame {
  MsgType type = MsgType::kInvalid;
  uint16_t version = 0;
  std::string payload;
};

// A decoded frame's bytes where the decoder holds them: valid until the next Feed, Reserve or Next* call.
struct FrameView {
  MsgType type = MsgType::kInvalid;
  uint16_t version = 0;
  std::string_view payload;
};

// Appends one frame (header + payload) to *out. False when the payload is over kMaxFrameBytes.
bool AppendFrame(std::string* out, MsgType type, const void* payload, size_t len);
std::string EncodeFrame(MsgType type, std::string_view payload);
template <typename T>
std::string EncodePod(MsgType type, const T& pod) {
  static_assert(std::is_trivially_copyable_v<T>);
  return EncodeFrame(type, std::string_view(reinterpret_cast<const char*>(&pod), sizeof(T)));
}

// Copies a fixed-size payload of a Frame or FrameView into *out; false when the size differs (a peer with another
// schema).
template <typename T, typename AnyFrame>
  requires std::is_same_v<AnyFrame, Frame> || std::is_same_v<AnyFrame, FrameView>
bool DecodePod(const AnyFrame& f, T* out) {
  static_assert(std::is_trivially_copyable_v<T>);
  if (f.payload.size() != sizeof(T)) return false;
  std::memcpy(out, f.payload.data(), sizeof(T));
  return true;
}

// The frames of one exchange payload of `total` bytes (prism/ipc.h): at least one, each with the header `h` at a
// growing offset and at most kExchangeChunkBytes of the payload. Calls on_frame(fh, h, off, n) for each in order, fh
// and h being that frame's headers and [off, off + n) its part of the payload; false as soon as on_frame is.
template <typename OnFrame>
bool ForEachExchangeFrame(MsgType type, ExchangeHeader h, uint64_t total, OnFrame&& on_frame) {
  h.total_bytes = total;
  uint64_t off = 0;
  do {
    const uint64_t n = std::min<uint64_t>(kExchangeChunkBytes, total - off);
    h.offset = off;
    FrameHeader fh;
    fh.type = static_cast<uint16_t>(type);
    fh.length = static_cast<uint32_t>(sizeof(h) + n);
    if (!on_frame(fh, h, off, n)) return false;
    off += n;
  } while (off < total);
  return true;
}
// How many frames ForEachExchangeFrame makes of `total` bytes.
inline uint64_t ExchangeFrameCount(uint64_t total) {
  return total == 0 ? 1 : (total + kExchangeChunkBytes - 1) / kExchangeChunkBytes;
}

enum class DecodeStatus { kFrame, kNeedMore, kError };

// Incremental decoder: feed bytes as they arrive (any split), take whole frames out. After kError the stream is
// unusable (bad magic, unknown version, oversized): drop the connection, error() says why.
// Two ways in: Feed (copies the bytes) or Reserve + Commit (the caller reads the socket straight into the
// decoder's buffer); two ways out: Next (copies the payload into a Frame) or NextView (a view, no copy).
class FrameDecoder {
 public:
  explicit FrameDecoder(uint32_t max_frame_bytes = kMaxFrameBytes) : max_(max_frame_bytes) {}
  void Feed(const void* data, size_t len);
  // Room for at least `len` bytes at the end of the buffered ones; Commit(n) says n of them were written.
  char* Reserve(size_t len);
  void Commit(size_t n) { len_ += n; }
  // How many bytes to read next: the rest of the frame being received when its header is in (so that a large
  // frame arrives in few reads and nothing after it is read into its buffer), else `dflt`.
  size_t WantBytes(size_t dflt) const;
  DecodeStatus Next(Frame* out);
  DecodeStatus NextView(FrameView* out);
  const std::string& error() const { return error_; }
  size_t buffered() const { return len_ - pos_; }

 private:
  std::unique_ptr<char[]> buf_;  // [pos_, len_) not decoded yet; not value-initialised (filled by reads)
  size_t cap_ = 0, len_ = 0, pos_ = 0;
  uint32_t max_;
  std::string error_;
  bool failed_ = false;
};

// Checks a header on its own: empty string when acceptable, else the reason.
std::string CheckHeader(const FrameHeader& h, uint32_t max_frame_bytes = kMaxFrameBytes);

enum class IoStatus { kOk, kClosed, kTimeout, kError };

// Blocking helpers over a connected stream socket. Retry on EINTR and short writes; never raise SIGPIPE.
// timeout_ms < 0 waits forever.
IoStatus WriteAll(int fd, const void* data, size_t len, std::string* error);
// After a write to fd failed (errno set): true when it should be tried again, on EINTR, or on EAGAIN once fd is
// writable (this waits for it); false when the error is final (errno untouched).
bool RetryWrite(int fd);
IoStatus ReadExact(int fd, void* data, size_t len, int timeout_ms, std::string* error);
IoStatus SendFrame(int fd, MsgType type, const void* payload, size_t len, std::string* error);
IoStatus RecvFrame(int fd, Frame* out, int timeout_ms, std::string* error);

// Connect helpers: a connected blocking fd (close-on-exec), or -1 with *error.
int ConnectUnix(const std::string& path, std::string* error);
int ConnectTcp(const std::string& host, uint16_t port, int timeout_ms, std::string* error);

// NCCL unique ids that the coordinator synthesizes for communicators whose leader is a virtual rank
// (src/coordinator/store/virtual_ranks.h). Layout of the 128 bytes (little-endian):
//   [0,8)   "PRISMVID"          [8,12)  uint32 layout version (1)      [12,16) int32 writer's global rank
//   [16,24) FNV-1a 64 of the key [24,32) FNV-1a 64 of the key, second basis   [32,128) last 96 bytes of the key
inline constexpr size_t kNcclIdBytes = 128;
inline constexpr char kVirtualIdMagic[8] = {'P', 'R', 'I', 'S', 'M', 'V', 'I', 'D'};
inline constexpr uint32_t kVirtualIdVersion = 1;

std::string MakeVirtualNcclId(std::string_view key, int writer_rank);
// True when `id` (kNcclIdBytes long) came from MakeVirtualNcclId; *writer_rank receives the virtual leader.
bool IsVirtualNcclId(const void* id, size_t len, int* writer_rank = nullptr);

// Lower-case hex, for ids in JSON messages (kCommInit "key").
std::string HexEncode(std::string_view bytes);
bool HexDecode(std::string_view hex, std::string* out);

}  // namespace prism::ipc
