#include "interpose/core/recorded.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "common/log.h"
#include "interpose/core/config.h"
#include "interpose/core/runtime.h"

namespace prism::interpose {

struct RecordedEntry {
  uint64_t offset;  // of the data in the mapping
  uint64_t bytes;
  uint16_t op;
  uint8_t dtype;
};

// The recorded-payload writer and reader (a part of the runtime, runtime.h).
struct RecordedState {
  std::mutex mu;
  // writer
  bool writer_tried = false;
  FILE* out = nullptr;
  // reader
  bool reader_tried = false;
  const uint8_t* map = nullptr;
  size_t map_len = 0;
  std::unordered_map<uint64_t, RecordedEntry> index;  // key: comm_id << 40 | seq
  std::atomic<uint64_t> written{0}, hits{0}, misses{0}, mismatches{0}, over_limit{0};
};

RecordedState* NewRecordedState() { return new RecordedState(); }

void DestroyPart(RecordedState* p) {
  if (p->out) std::fclose(p->out);
  if (p->map) munmap(const_cast<uint8_t*>(p->map), p->map_len);
  delete p;
}

namespace {

using State = RecordedState;

State& S() { return Rt().recorded(); }

uint64_t Key(uint32_t comm_id, uint64_t seq) { return (static_cast<uint64_t>(comm_id) << 40) ^ seq; }

void LoadLocked(State& s) {
  s.reader_tried = true;
  const std::string& path = Cfg().payload_file;
  if (path.empty()) {
    Log("nccl")->warn("payload policy 'recorded' without PRISM_PAYLOAD_FILE: every operation uses mirror");
    return;
  }
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  struct stat st {};
  if (fd < 0 || fstat(fd, &st) != 0 || st.st_size < 8) {
    Log("nccl")->error("cannot read recorded payloads {}: {}; using mirror", path, fd < 0 ? std::strerror(errno) : "too short");
    if (fd >= 0) close(fd);
    return;
  }
  void* m = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (m == MAP_FAILED) {
    Log("nccl")->error("cannot map recorded payloads {}; using mirror", path);
    return;
  }
  s.map = static_cast<const uint8_t*>(m);
  s.map_len = static_cast<size_t>(st.st_size);
  if (std::memcmp(s.map, kPayloadMagic, 8) != 0) {
    Log("nccl")->error("{} is not a recorded-payload file (magic); using mirror", path);
    return;
  }
  size_t off = 8;
  try {
    while (off + sizeof(RecordHeader) <= s.map_len) {
      RecordHeader h;
      std::memcpy(&h, s.map + off, sizeof(h));
      off += sizeof(h);
      if (h.bytes > s.map_len - off) {
        Log("nccl")->warn("{}: last record truncated (the recording rank stopped mid-write); ignored", path);
        break;
      }
      s.index[Key(h.comm_id, h.seq)] = RecordedEntry{off, h.bytes, h.op, h.dtype};
      off += h.bytes;
    }
  } catch (...) {
    s.index.clear();
  }
  Log("nccl")->info("recorded payloads: {} operations from {}", s.index.size(), path);
}

bool OverLimit(uint64_t bytes) {
  const uint64_t max = Cfg().payload_max_bytes;
  return max != 0 && bytes > max;
}

}  // namespace

void RecordPayload(uint32_t comm_id, uint64_t seq, uint16_t op, uint8_t dtype, const void* data, uint64_t bytes) {
  State& s = S();
  if (OverLimit(bytes)) {
    s.over_limit.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.writer_tried) {
    s.writer_tried = true;
    const std::string& path = Cfg().record_payloads;
    if (!path.empty()) {
      s.out = std::fopen(path.c_str(), "wb");
      if (s.out == nullptr) {
        Log("nccl")->error("cannot write recorded payloads to {}: {}", path, std::strerror(errno));
      } else {
        std::fwrite(kPayloadMagic, 1, 8, s.out);
      }
    }
  }
  if (s.out == nullptr) return;
  RecordHeader h{};
  h.comm_id = comm_id;
  h.op = op;
  h.dtype = dtype;
  h.seq = seq;
  h.bytes = bytes;
  std::fwrite(&h, sizeof(h), 1, s.out);
  if (bytes) std::fwrite(data, 1, bytes, s.out);
  std::fflush(s.out);  // Why every record: a rank killed at the end of collect keeps what it wrote
  s.written.fetch_add(1, std::memory_order_relaxed);
}

const void* FindRecorded(uint32_t comm_id, uint64_t seq, uint16_t op, uint8_t dtype, uint64_t bytes) {
  if (OverLimit(bytes)) {
    S().over_limit.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.reader_tried) LoadLocked(s);
  auto it = s.index.find(Key(comm_id, seq));
  if (it == s.index.end()) {
    s.misses.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  const RecordedEntry& e = it->second;
  if (e.op != op || e.dtype != dtype || e.bytes != bytes) {
    s.mismatches.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  s.hits.fetch_add(1, std::memory_order_relaxed);
  return s.map + e.offset;
}

RecordedStats GetRecordedStats() {
  State& s = S();
  return RecordedStats{s.written.load(), s.hits.load(), s.misses.load(), s.mismatches.load(), s.over_limit.load()};
}

}  // namespace prism::interpose
