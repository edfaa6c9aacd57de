#include "coordinator/store_state.h"

#include <algorithm>
#include <cctype>
#include <charconv>

#include <fmt/format.h>

namespace prism::store {
namespace {

// Why a separate namespace of wait keys: a BARRIER participant must only be woken when the count reaches the
// world size, not by the ADD-like increments of the others, which do wake plain WAITs on the same key.
std::string BarrierWaitKey(std::string_view key) {
  std::string k("\0barrier\0", 9);
  k.append(key);
  return k;
}

}  // namespace

StoreState::StoreState(Notify notify, StandIn* stand_in, uint64_t max_total_bytes)
    : notify_(std::move(notify)), stand_in_(stand_in), max_total_bytes_(max_total_bytes) {}

bool StoreState::Exists(std::string_view key) const {
  if (kv_.find(key) != kv_.end()) return true;
  auto q = queues_.find(key);
  return q != queues_.end() && !q->second.empty();
}

bool StoreState::Store(std::string_view key, std::string value, std::string* error) {
  auto it = kv_.find(key);
  uint64_t old = it == kv_.end() ? 0 : key.size() + it->second.size();
  uint64_t next = bytes_ - old + key.size() + value.size();
  if (next > max_total_bytes_ && next > bytes_) {
    if (error) *error = fmt::format("store is full ({} bytes, limit {})", bytes_, max_total_bytes_);
    return false;
  }
  bytes_ = next;
  if (it == kv_.end()) {
    kv_.emplace(std::string(key), std::move(value));
  } else {
    it->second = std::move(value);
  }
  WakeAll(key);
  return true;
}

bool StoreState::TryMaterialize(std::string_view key, StandIn::Access access,
                                std::span<const std::string_view> batch) {
  if (!stand_in_) return false;
  std::optional<std::string> v = stand_in_->Materialize(key, access, batch);
  if (!v) return false;
  std::string error;
  if (!Store(key, std::move(*v), &error)) return false;
  ++materialized_;
  return true;
}

bool StoreState::ParseCounter(std::string_view key, int64_t* value, std::string* error) const {
  auto it = kv_.find(key);
  if (it == kv_.end()) {
    *value = 0;
    return true;
  }
  // Why this leniency: the libuv server parses with std::stoll, which skips leading spaces and ignores trailing
  // characters; a value torch accepts must not get a client dropped here.
  const std::string& s = it->second;
  size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  if (i < s.size() && s[i] == '+') ++i;
  int64_t v = 0;
  auto [end, ec] = std::from_chars(s.data() + i, s.data() + s.size(), v);
  if (ec != std::errc() || end == s.data() + i) {
    *error = fmt::format("ADD on key '{}' whose value '{}' is not an integer", PrintableKey(key), PrintableKey(s, 40));
    return false;
  }
  *value = v;
  return true;
}

void StoreState::WakeAll(std::string_view key) {
  auto it = waiters_.find(key);
  if (it == waiters_.end()) return;
  std::vector<uint64_t> ids = std::move(it->second);
  waiters_.erase(it);
  for (uint64_t id : ids) {
    auto w = waits_.find(id);
    if (w == waits_.end()) continue;
    if (w->second.remaining > 0 && --w->second.remaining == 0) Finish(id);
  }
}

void StoreState::WakeOne(std::string_view key) {
  auto it = waiters_.find(key);
  if (it == waiters_.end()) return;
  std::vector<uint64_t>& ids = it->second;
  while (!ids.empty()) {
    uint64_t id = ids.front();
    ids.erase(ids.begin());
    auto w = waits_.find(id);
    if (w == waits_.end()) continue;
    if (w->second.remaining > 0 && --w->second.remaining == 0) Finish(id);
    break;
  }
  if (ids.empty()) waiters_.erase(it);
}

void StoreState::Finish(uint64_t wait_id) {
  auto w = waits_.find(wait_id);
  if (w == waits_.end()) return;
  ClientId client = w->second.client;
  waits_.erase(w);
  auto cw = client_waits_.find(client);
  if (cw != client_waits_.end()) {
    std::erase(cw->second, wait_id);
    if (cw->second.empty()) client_waits_.erase(cw);
  }
  const char stop = static_cast<char>(kStopWaiting);
  notify_(client, std::string_view(&stop, 1));
}

void StoreState::CancelWaits(ClientId client) {
  auto cw = client_waits_.find(client);
  if (cw == client_waits_.end()) return;
  for (uint64_t id : cw->second) {
    auto w = waits_.find(id);
    if (w == waits_.end()) continue;
    for (const std::string& k : w->second.keys) {
      auto it = waiters_.find(k);
      if (it == waiters_.end()) continue;
      std::erase(it->second, id);
      if (it->second.empty()) waiters_.erase(it);
    }
    waits_.erase(w);
  }
  client_waits_.erase(cw);
}

void StoreState::DropClient(ClientId client) { CancelWaits(client); }

bool StoreState::Handle(ClientId client, const Request& req, std::string* reply, std::string* error,
                        uint64_t max_reply) {
  ++requests_;
  // True when `n` more reply bytes fit under max_reply; otherwise says so in *error (StoreServer matches the text).
  auto fits = [&](uint64_t n) {
    if (reply->size() + n <= max_reply) return true;
    *error = fmt::format("its reply would pass {} bytes", max_reply);
    return false;
  };
  // Appends `bytes` (length first) when they fit.
  auto put_bytes = [&](std::string_view bytes) {
    if (!fits(8 + bytes.size())) return false;
    PutBytes(reply, bytes);
    return true;
  };
  const auto& keys = req.keys;
  std::span<const std::string_view> batch(keys.data(), keys.size());
  // GET's and MULTI_GET's answer for one key: its value (a stand-in materialized as for a read), empty when absent.
  auto put_value = [&](std::string_view key) {
    if (!Exists(key)) TryMaterialize(key, StandIn::Access::kRead, batch);
    auto it = kv_.find(key);
    return put_bytes(it == kv_.end() ? std::string_view() : std::string_view(it->second));
  };
  // ADD's and BARRIER's counter: the first key's value as a number (a stand-in materialized as for ADD).
  auto counter = [&](int64_t* v) {
    if (!Exists(keys[0])) TryMaterialize(keys[0], StandIn::Access::kAdd, batch);
    return ParseCounter(keys[0], v, error);
  };
  switch (req.type) {
    case QueryType::kValidate:
      return true;
    case QueryType::kPing:
      PutU32(reply, req.u32);
      return true;
    case QueryType::kSet:
      if (stand_in_ && stand_in_->OnSet(keys[0], req.values[0])) {
        RetryWaits();  // the stand-in consumed a registration: it may answer keys waited on before
        return true;
      }
      return Store(keys[0], std::string(req.values[0]), error);
    case QueryType::kCompareSet: {
      std::string_view key = keys[0], expected = req.values[0], desired = req.values[1];
      auto it = kv_.find(key);
      if (it == kv_.end()) {
        if (expected.empty()) {
          if (stand_in_ && stand_in_->OnSet(key, desired)) {
            PutBytes(reply, desired);
            return true;
          }
          if (!Store(key, std::string(desired), error)) return false;
          PutBytes(reply, desired);
        } else {
          // Same answer as torch's server: the expected value back, nothing stored. (Torch also wakes the key's
          // waiters here although nothing was stored; we do not: they would only read an empty value.)
          PutBytes(reply, expected);
        }
        return true;
      }
      if (it->second == expected && !Store(key, std::string(desired), error)) return false;
      return put_bytes(kv_.find(key)->second);
    }
    case QueryType::kGet:
      return put_value(keys[0]);
    case QueryType::kAdd: {
      int64_t v = 0;
      if (!counter(&v)) return false;
      int64_t sum = 0;
      if (__builtin_add_overflow(v, req.i64, &sum)) {
        *error = fmt::format("ADD {} to {} on key '{}' overflows", req.i64, v, PrintableKey(keys[0]));
        return false;
      }
      if (!Store(keys[0], std::to_string(sum), error)) return false;
      PutI64(reply, sum);
      return true;
    }
    case QueryType::kCheck: {
      bool all = true;
      for (std::string_view k : keys) {
        if (!Exists(k) && !TryMaterialize(k, StandIn::Access::kRead, batch)) all = false;
      }
      PutU8(reply, all ? kCheckReady : kCheckNotReady);
      return true;
    }
    case QueryType::kWait: {
      std::vector<std::string> missing;
      for (std::string_view k : keys) {
        if (Exists(k) || TryMaterialize(k, StandIn::Access::kRead, batch)) continue;
        if (std::find(missing.begin(), missing.end(), k) == missing.end()) missing.emplace_back(k);
      }
      if (missing.empty()) {
        PutU8(reply, kStopWaiting);
        return true;
      }
      uint64_t id = next_wait_++;
      for (const std::string& k : missing) waiters_[k].push_back(id);
      Wait w{client, missing.size(), {}};
      w.keys.assign(keys.begin(), keys.end());
      waits_.emplace(id, std::move(w));
      client_waits_[client].push_back(id);
      return true;
    }
    case QueryType::kGetNumKeys:
      PutI64(reply, static_cast<int64_t>(kv_.size()));
      return true;
    case QueryType::kDeleteKey: {
      auto it = kv_.find(keys[0]);
      int64_t n = 0;
      if (it != kv_.end()) {
        bytes_ -= it->first.size() + it->second.size();
        kv_.erase(it);
        n = 1;
      }
      PutI64(reply, n);
      return true;
    }
    case QueryType::kAppend: {
      auto it = kv_.find(keys[0]);
      std::string v = it == kv_.end() ? std::string() : it->second;
      v.append(req.values[0]);
      return Store(keys[0], std::move(v), error);
    }
    case QueryType::kMultiGet:
      for (std::string_view k : keys) {
        if (!put_value(k)) return false;
      }
      return true;
    case QueryType::kMultiSet:
      for (size_t i = 0; i < keys.size(); ++i) {
        if (stand_in_ && stand_in_->OnSet(keys[i], req.values[i])) {
          RetryWaits();
          continue;
        }
        if (!Store(keys[i], std::string(req.values[i]), error)) return false;
      }
      return true;
    case QueryType::kCancelWait:
      CancelWaits(client);
      PutU8(reply, kWaitCanceled);
      return true;
    case QueryType::kQueuePush: {
      uint64_t next = bytes_ + keys[0].size() + req.values[0].size();
      if (next > max_total_bytes_) {
        *error = fmt::format("store is full ({} bytes, limit {})", bytes_, max_total_bytes_);
        return false;
      }
      bytes_ = next;
      queues_[std::string(keys[0])].emplace_back(req.values[0]);
      WakeOne(keys[0]);
      return true;
    }
    case QueryType::kQueuePop: {
      auto it = queues_.find(keys[0]);
      if (it == queues_.end() || it->second.empty()) {
        PutI64(reply, 0);
        return true;
      }
      // Why before the pop: a client dropped for its reply must not take the item with it.
      if (!fits(16 + it->second.front().size())) return false;
      PutI64(reply, static_cast<int64_t>(it->second.size()));
      PutBytes(reply, it->second.front());
      bytes_ -= keys[0].size() + it->second.front().size();
      it->second.pop_front();
      if (it->second.empty()) queues_.erase(it);
      return true;
    }
    case QueryType::kQueueLen: {
      auto it = queues_.find(keys[0]);
      PutI64(reply, it == queues_.end() ? 0 : static_cast<int64_t>(it->second.size()));
      return true;
    }
    case QueryType::kListKeys:
      PutI64(reply, static_cast<int64_t>(kv_.size()));
      for (const auto& [k, v] : kv_) {
        if (!put_bytes(k)) return false;
      }
      return true;
    case QueryType::kBarrier: {
      int64_t v = 0;
      if (!counter(&v)) return false;
      int64_t count = v + 1;
      if (!Store(keys[0], std::to_string(count), error)) return false;
      if (count >= req.i64) {
        WakeAll(BarrierWaitKey(keys[0]));
        PutU8(reply, kStopWaiting);
        return true;
      }
      uint64_t id = next_wait_++;
      std::string wk = BarrierWaitKey(keys[0]);
      waiters_[wk].push_back(id);
      waits_.emplace(id, Wait{client, 1, {wk}});
      client_waits_[client].push_back(id);
      return true;
    }
  }
  *error = "unhandled command";
  return false;
}

void StoreState::RetryWaits() {
  if (!stand_in_ || waiters_.empty()) return;
  // Why copy first: materializing wakes waits, which edits waiters_.
  std::vector<std::pair<std::string, uint64_t>> pending;
  for (const auto& [k, ids] : waiters_) {
    if (k.size() >= 9 && k.compare(0, 9, std::string_view("\0barrier\0", 9)) == 0) continue;
    if (!ids.empty()) pending.emplace_back(k, ids.front());
  }
  for (const auto& [k, id] : pending) {
    if (Exists(k)) continue;
    auto w = waits_.find(id);
    std::vector<std::string_view> batch;
    if (w != waits_.end()) batch.assign(w->second.keys.begin(), w->second.keys.end());
    TryMaterialize(k, StandIn::Access::kRead, std::span<const std::string_view>(batch.data(), batch.size()));
  }
}

void StoreState::Set(std::string_view key, std::string_view value) { Store(key, std::string(value), nullptr); }

std::optional<std::string> StoreState::Get(std::string_view key) const {
  auto it = kv_.find(key);
  if (it == kv_.end()) return std::nullopt;
  return it->second;
}

StoreStats StoreState::Stats() const {
  StoreStats s;
  s.keys = kv_.size();
  s.bytes = bytes_;
  s.waits = waits_.size();
  s.requests = requests_;
  s.materialized = materialized_;
  return s;
}

std::vector<ClientId> StoreState::WaitingClients() const {
  std::vector<ClientId> out;
  for (const auto& [client, ids] : client_waits_) {
    if (std::any_of(ids.begin(), ids.end(), [&](uint64_t id) { return waits_.count(id) > 0; })) out.push_back(client);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> StoreState::WaitedKeys(size_t max) const {
  std::vector<std::string> out;
  for (const auto& [k, ids] : waiters_) {
    if (out.size() >= max) break;
    bool live = false;
    for (uint64_t id : ids) live = live || waits_.count(id) > 0;
    if (!live) continue;
    if (k.size() >= 9 && k.compare(0, 9, std::string_view("\0barrier\0", 9)) == 0) {
      out.push_back("BARRIER " + k.substr(9));
    } else {
      out.push_back(k);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace prism::store
