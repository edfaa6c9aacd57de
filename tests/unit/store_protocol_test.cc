// The TCPStore request parser: every command round-trips, any split of a request waits for the rest, and what
// is not a request is refused as soon as it can be told.
#include <gtest/gtest.h>

#include <cstring>

#include "coordinator/store/store_protocol.h"

namespace prism::store {
namespace {

ParseStatus Parse(const std::string& bytes, Request* req, size_t* consumed, std::string* error,
                  const Limits& limits = Limits{}) {
  return ParseRequest(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), limits, req, consumed, error);
}

struct Case {
  std::string name;
  std::string bytes;
  QueryType type;
  std::vector<std::string> keys;
  std::vector<std::string> values;
  uint32_t u32 = 0;
  int64_t i64 = 0;
};

std::vector<Case> AllCommands() {
  std::string id(128, '\x7f');
  return {
      {"validate", EncodeValidate(), QueryType::kValidate, {}, {}, kValidationMagic},
      {"ping", EncodePing(0x1234), QueryType::kPing, {}, {}, 0x1234},
      {"set", EncodeKeyValue(QueryType::kSet, "/default_pg/0//cuda//0", id), QueryType::kSet,
       {"/default_pg/0//cuda//0"}, {id}},
      {"set empty", EncodeKeyValue(QueryType::kSet, "", ""), QueryType::kSet, {""}, {""}},
      {"compare_set", EncodeCompareSet("k", "old", "new"), QueryType::kCompareSet, {"k"}, {"old", "new"}},
      {"get", EncodeKeyOnly(QueryType::kGet, "/k"), QueryType::kGet, {"/k"}, {}},
      {"add", EncodeAdd("init/", -5), QueryType::kAdd, {"init/"}, {}, 0, -5},
      {"check", EncodeKeyList(QueryType::kCheck, {"/exception_dump"}), QueryType::kCheck, {"/exception_dump"}, {}},
      {"wait", EncodeKeyList(QueryType::kWait, {"a", "b", "c"}), QueryType::kWait, {"a", "b", "c"}, {}},
      {"wait none", EncodeKeyList(QueryType::kWait, {}), QueryType::kWait, {}, {}},
      {"getnumkeys", EncodeNoArgs(QueryType::kGetNumKeys), QueryType::kGetNumKeys, {}, {}},
      {"delete", EncodeKeyOnly(QueryType::kDeleteKey, "x"), QueryType::kDeleteKey, {"x"}, {}},
      {"append", EncodeKeyValue(QueryType::kAppend, "x", "yz"), QueryType::kAppend, {"x"}, {"yz"}},
      {"multi_get", EncodeKeyList(QueryType::kMultiGet, {"u:0", "u:1"}), QueryType::kMultiGet, {"u:0", "u:1"}, {}},
      {"multi_set", EncodeMultiSet({"a", "b"}, {"1", "22"}), QueryType::kMultiSet, {"a", "b"}, {"1", "22"}},
      {"cancel_wait", EncodeNoArgs(QueryType::kCancelWait), QueryType::kCancelWait, {}, {}},
      {"queue_push", EncodeKeyValue(QueryType::kQueuePush, "q", "item"), QueryType::kQueuePush, {"q"}, {"item"}},
      {"queue_pop", EncodeKeyOnly(QueryType::kQueuePop, "q"), QueryType::kQueuePop, {"q"}, {}},
      {"queue_len", EncodeKeyOnly(QueryType::kQueueLen, "q"), QueryType::kQueueLen, {"q"}, {}},
      {"list_keys", EncodeNoArgs(QueryType::kListKeys), QueryType::kListKeys, {}, {}},
      {"barrier", EncodeBarrier("b", 8), QueryType::kBarrier, {"b"}, {}, 0, 8},
  };
}

TEST(StoreProtocol, EveryCommandRoundTrips) {
  for (const Case& c : AllCommands()) {
    SCOPED_TRACE(c.name);
    Request req;
    size_t consumed = 0;
    std::string error;
    ASSERT_EQ(Parse(c.bytes, &req, &consumed, &error), ParseStatus::kOk) << error;
    EXPECT_EQ(consumed, c.bytes.size());
    EXPECT_EQ(req.type, c.type);
    ASSERT_EQ(req.keys.size(), c.keys.size());
    for (size_t i = 0; i < c.keys.size(); ++i) EXPECT_EQ(req.keys[i], c.keys[i]);
    ASSERT_EQ(req.values.size(), c.values.size());
    for (size_t i = 0; i < c.values.size(); ++i) EXPECT_EQ(req.values[i], c.values[i]);
    EXPECT_EQ(req.u32, c.u32);
    EXPECT_EQ(req.i64, c.i64);
  }
}

TEST(StoreProtocol, EveryPrefixOfARequestNeedsMore) {
  for (const Case& c : AllCommands()) {
    SCOPED_TRACE(c.name);
    for (size_t n = 0; n < c.bytes.size(); ++n) {
      Request req;
      size_t consumed = 0;
      std::string error;
      ASSERT_EQ(Parse(c.bytes.substr(0, n), &req, &consumed, &error), ParseStatus::kNeedMore) << "prefix " << n;
    }
  }
}

TEST(StoreProtocol, BackToBackRequestsParseOneAtATime) {
  std::string all;
  for (const Case& c : AllCommands()) all += c.bytes;
  size_t pos = 0, count = 0;
  while (pos < all.size()) {
    Request req;
    size_t consumed = 0;
    std::string error;
    ASSERT_EQ(Parse(all.substr(pos), &req, &consumed, &error), ParseStatus::kOk) << error;
    pos += consumed;
    ++count;
  }
  EXPECT_EQ(count, AllCommands().size());
}

TEST(StoreProtocol, UnknownCommandIsAnError) {
  Request req;
  size_t consumed = 0;
  std::string error;
  EXPECT_EQ(Parse(std::string(1, '\x13'), &req, &consumed, &error), ParseStatus::kError);
  EXPECT_NE(error.find("unknown command byte 0x13"), std::string::npos) << error;
  EXPECT_EQ(Parse(std::string(1, '\xff'), &req, &consumed, &error), ParseStatus::kError);
}

TEST(StoreProtocol, OversizedLengthsAreRefusedBeforeTheBytesArrive) {
  Request req;
  size_t consumed = 0;
  std::string error;
  // A key length over 8 KiB: refused from the 9 header bytes alone.
  std::string s;
  PutU8(&s, static_cast<uint8_t>(QueryType::kGet));
  PutU64(&s, 8 * 1024 + 1);
  EXPECT_EQ(Parse(s, &req, &consumed, &error), ParseStatus::kError);
  EXPECT_NE(error.find("key length 8193"), std::string::npos) << error;
  // Exactly 8 KiB is fine (needs the bytes).
  s.clear();
  PutU8(&s, static_cast<uint8_t>(QueryType::kGet));
  PutU64(&s, 8 * 1024);
  EXPECT_EQ(Parse(s, &req, &consumed, &error), ParseStatus::kNeedMore);
  // A value over 8 MiB.
  s.clear();
  PutU8(&s, static_cast<uint8_t>(QueryType::kSet));
  PutBytes(&s, "k");
  PutU64(&s, (8u << 20) + 1);
  EXPECT_EQ(Parse(s, &req, &consumed, &error), ParseStatus::kError);
  EXPECT_NE(error.find("value length"), std::string::npos) << error;
  // More than 128K keys.
  s.clear();
  PutU8(&s, static_cast<uint8_t>(QueryType::kWait));
  PutU64(&s, 128 * 1024 + 1);
  EXPECT_EQ(Parse(s, &req, &consumed, &error), ParseStatus::kError);
  EXPECT_NE(error.find("key count"), std::string::npos) << error;
  // A length that wraps: 2^64-1.
  s.clear();
  PutU8(&s, static_cast<uint8_t>(QueryType::kSet));
  PutU64(&s, ~0ull);
  EXPECT_EQ(Parse(s, &req, &consumed, &error), ParseStatus::kError);
}

TEST(StoreProtocol, WholeRequestSizeIsBounded) {
  Limits small;
  small.max_request_bytes = 1000;
  Request req;
  size_t consumed = 0;
  std::string error;
  std::vector<std::string> keys(200, std::string(10, 'k'));  // 200 x 18 bytes > 1000
  std::string s = EncodeKeyList(QueryType::kMultiGet, keys);
  EXPECT_EQ(Parse(s.substr(0, 1100), &req, &consumed, &error, small), ParseStatus::kError) << "prefix already over";
  EXPECT_EQ(Parse(s, &req, &consumed, &error, small), ParseStatus::kError);
  EXPECT_NE(error.find("limit 1000"), std::string::npos) << error;
}

TEST(StoreProtocol, ScalarsAreLittleEndianAsTorchSendsThem) {
  // The VALIDATE bytes seen from torch 2.11 on the GPU machine: 00 ce f7 85 3c.
  std::string v = EncodeValidate();
  ASSERT_EQ(v.size(), 5u);
  EXPECT_EQ(std::memcmp(v.data(), "\x00\xce\xf7\x85\x3c", 5), 0);
  std::string a = EncodeAdd("init/", 1);
  EXPECT_EQ(a, std::string("\x04\x05\x00\x00\x00\x00\x00\x00\x00init/\x01\x00\x00\x00\x00\x00\x00\x00", 22));
}

TEST(StoreProtocol, PrintableKeyEscapes) {
  EXPECT_EQ(PrintableKey("a\x01z"), "a\\x01z");
  EXPECT_EQ(PrintableKey(std::string(200, 'k'), 4), "kkkk...(200 bytes)");
}

}  // namespace
}  // namespace prism::store
