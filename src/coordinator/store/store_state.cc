#include "coordinator/store/store_state.h"

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

bool StoreState::Call::Fits(uint64_t n) const {
  if (reply->size() + n <= max_reply) return true;
  *error = fmt::format("its reply would pass {} bytes", max_reply);  // StoreServer matches this text
  return false;
}

bool StoreState::Call::PutBytes(std::string_view bytes) const {
  if (!Fits(8 + bytes.size())) return false;
  store::PutBytes(reply, bytes);
  return true;
}

bool StoreState::Handle(ClientId client, const Request& req, std::string* reply, std::string* error,
                        uint64_t max_reply) {
  ++requests_;
  const Call c{client, req, reply, error, max_reply, std::span<const std::string_view>(req.keys)};
  const std::string_view key = req.keys.empty() ? std::string_view() : req.keys[0];
  switch (req.type) {
    case QueryType::kValidate:
      return true;
    case QueryType::kPing:
      PutU32(reply, req.u32);
      return true;
    case QueryType::kSet:
      return SetKey(key, req.values[0], error);
    case QueryType::kCompareSet:
      return CompareSet(c);
    case QueryType::kGet:
      return PutValue(c, key);
    case QueryType::kAdd:
      return Add(c);
    case QueryType::kCheck:
      return Check(c);
    case QueryType::kWait:
      return WaitFor(c);
    case QueryType::kGetNumKeys:
      PutI64(reply, static_cast<int64_t>(kv_.size()));
      return true;
    case QueryType::kDeleteKey:
      PutI64(reply, Delete(key) ? 1 : 0);
      return true;
    case QueryType::kAppend: {
      auto it = kv_.find(key);
      std::string v = it == kv_.end() ? std::string() : it->second;
      v.append(req.values[0]);
      return Store(key, std::move(v), error);
    }
    case QueryType::kMultiGet:
      for (std::string_view k : req.keys) {
        if (!PutValue(c, k)) return false;
      }
      return true;
    case QueryType::kMultiSet:
      for (size_t i = 0; i < req.keys.size(); ++i) {
        if (!SetKey(req.keys[i], req.values[i], error)) return false;
      }
      return true;
    case QueryType::kCancelWait:
      CancelWaits(client);
      PutU8(reply, kWaitCanceled);
      return true;
    case QueryType::kQueuePush:
      return QueuePush(c);
    case QueryType::kQueuePop:
      return QueuePop(c);
    case QueryType::kQueueLen: {
      auto it = queues_.find(key);
      PutI64(reply, it == queues_.end() ? 0 : static_cast<int64_t>(it->second.size()));
      return true;
    }
    case QueryType::kListKeys:
      PutI64(reply, static_cast<int64_t>(kv_.size()));
      for (const auto& [k, v] : kv_) {
        if (!c.PutBytes(k)) return false;
      }
      return true;
    case QueryType::kBarrier:
      return Barrier(c);
  }
  *error = "unhandled command";
  return false;
}

bool StoreState::SetKey(std::string_view key, std::string_view value, std::string* error) {
  if (stand_in_ && stand_in_->OnSet(key, value)) {
    RetryWaits();  // the stand-in consumed a registration: it may answer keys waited on before
    return true;
  }
  return Store(key, std::string(value), error);
}

bool StoreState::PutValue(const Call& c, std::string_view key) {
  if (!Exists(key)) TryMaterialize(key, StandIn::Access::kRead, c.batch);
  auto it = kv_.find(key);
  return c.PutBytes(it == kv_.end() ? std::string_view() : std::string_view(it->second));
}

bool StoreState::Counter(const Call& c, int64_t* value) {
  const std::string_view key = c.req.keys[0];
  if (!Exists(key)) TryMaterialize(key, StandIn::Access::kAdd, c.batch);
  return ParseCounter(key, value, c.error);
}

bool StoreState::CompareSet(const Call& c) {
  std::string_view key = c.req.keys[0], expected = c.req.values[0], desired = c.req.values[1];
  auto it = kv_.find(key);
  if (it == kv_.end()) {
    if (expected.empty()) {
      if (stand_in_ && stand_in_->OnSet(key, desired)) {
        store::PutBytes(c.reply, desired);
        return true;
      }
      if (!Store(key, std::string(desired), c.error)) return false;
      store::PutBytes(c.reply, desired);
    } else {
      // Same answer as torch's server: the expected value back, nothing stored. (Torch also wakes the key's
      // waiters here although nothing was stored; we do not: they would only read an empty value.)
      store::PutBytes(c.reply, expected);
    }
    return true;
  }
  if (it->second == expected && !Store(key, std::string(desired), c.error)) return false;
  return c.PutBytes(kv_.find(key)->second);
}

bool StoreState::Add(const Call& c) {
  int64_t v = 0;
  if (!Counter(c, &v)) return false;
  int64_t sum = 0;
  if (__builtin_add_overflow(v, c.req.i64, &sum)) {
    *c.error = fmt::format("ADD {} to {} on key '{}' overflows", c.req.i64, v, PrintableKey(c.req.keys[0]));
    return false;
  }
  if (!Store(c.req.keys[0], std::to_string(sum), c.error)) return false;
  PutI64(c.reply, sum);
  return true;
}

bool StoreState::Check(const Call& c) {
  bool all = true;
  for (std::string_view k : c.req.keys) {
    if (!Exists(k) && !TryMaterialize(k, StandIn::Access::kRead, c.batch)) all = false;
  }
  PutU8(c.reply, all ? kCheckReady : kCheckNotReady);
  return true;
}

bool StoreState::WaitFor(const Call& c) {
  std::vector<std::string> missing;
  for (std::string_view k : c.req.keys) {
    if (Exists(k) || TryMaterialize(k, StandIn::Access::kRead, c.batch)) continue;
    if (std::find(missing.begin(), missing.end(), k) == missing.end()) missing.emplace_back(k);
  }
  if (missing.empty()) {
    PutU8(c.reply, kStopWaiting);
    return true;
  }
  // Why every key of the request in the wait: RetryWaits offers them to the stand-in as the batch.
  Park(c.client, missing, std::vector<std::string>(c.req.keys.begin(), c.req.keys.end()));
  return true;
}

void StoreState::Park(ClientId client, const std::vector<std::string>& wait_on, std::vector<std::string> keys) {
  const uint64_t id = next_wait_++;
  for (const std::string& k : wait_on) waiters_[k].push_back(id);
  waits_.emplace(id, Wait{client, wait_on.size(), std::move(keys)});
  client_waits_[client].push_back(id);
}

bool StoreState::Delete(std::string_view key) {
  auto it = kv_.find(key);
  if (it == kv_.end()) return false;
  bytes_ -= it->first.size() + it->second.size();
  kv_.erase(it);
  return true;
}

bool StoreState::QueuePush(const Call& c) {
  const std::string_view key = c.req.keys[0], value = c.req.values[0];
  const uint64_t next = bytes_ + key.size() + value.size();
  if (next > max_total_bytes_) {
    *c.error = fmt::format("store is full ({} bytes, limit {})", bytes_, max_total_bytes_);
    return false;
  }
  bytes_ = next;
  queues_[std::string(key)].emplace_back(value);
  WakeOne(key);
  return true;
}

bool StoreState::QueuePop(const Call& c) {
  const std::string_view key = c.req.keys[0];
  auto it = queues_.find(key);
  if (it == queues_.end() || it->second.empty()) {
    PutI64(c.reply, 0);
    return true;
  }
  // Why before the pop: a client dropped for its reply must not take the item with it.
  if (!c.Fits(16 + it->second.front().size())) return false;
  PutI64(c.reply, static_cast<int64_t>(it->second.size()));
  store::PutBytes(c.reply, it->second.front());
  bytes_ -= key.size() + it->second.front().size();
  it->second.pop_front();
  if (it->second.empty()) queues_.erase(it);
  return true;
}

bool StoreState::Barrier(const Call& c) {
  int64_t v = 0;
  if (!Counter(c, &v)) return false;
  const int64_t count = v + 1;
  if (!Store(c.req.keys[0], std::to_string(count), c.error)) return false;
  std::string wk = BarrierWaitKey(c.req.keys[0]);
  if (count >= c.req.i64) {
    WakeAll(wk);
    PutU8(c.reply, kStopWaiting);
    return true;
  }
  Park(c.client, {wk}, {wk});
  return true;
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
