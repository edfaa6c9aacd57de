#include <array>
#include <string_view>

#include "prism/trace.h"

namespace prism::trace {
namespace {

constexpr std::array<std::string_view, 5> kKindNames = {"invalid", "compute", "coll", "send", "recv"};
constexpr std::array<std::string_view, 8> kOpNames = {"invalid",       "allreduce", "allgather", "reducescatter",
                                                      "broadcast",     "reduce",    "alltoall",  "barrier"};
constexpr std::array<std::string_view, 13> kDTypeNames = {"invalid", "f32",  "f16", "bf16", "f64", "f8e4m3", "f8e5m2",
                                                          "i8",      "u8",   "i32", "u32",  "i64", "u64"};
constexpr std::array<std::string_view, 4> kSendCompletionNames = {"invalid", "rendezvous", "eager", "nccl"};
constexpr std::array<int, 13> kDTypeSizes = {0, 4, 2, 2, 8, 1, 1, 1, 1, 4, 4, 8, 8};

template <typename E, size_t N>
E Parse(const std::array<std::string_view, N>& names, std::string_view s) {
  for (size_t i = 1; i < N; ++i) {
    if (names[i] == s) return static_cast<E>(i);
  }
  return static_cast<E>(0);
}

template <size_t N>
std::string_view Name(const std::array<std::string_view, N>& names, size_t i) {
  return i < N ? names[i] : names[0];
}

}  // namespace

std::string_view ToString(NodeKind k) { return Name(kKindNames, static_cast<size_t>(k)); }
std::string_view ToString(CollOp op) { return Name(kOpNames, static_cast<size_t>(op)); }
std::string_view ToString(DType t) { return Name(kDTypeNames, static_cast<size_t>(t)); }
std::string_view ToString(SendCompletion c) { return Name(kSendCompletionNames, static_cast<size_t>(c)); }
NodeKind ParseNodeKind(std::string_view s) { return Parse<NodeKind>(kKindNames, s); }
CollOp ParseCollOp(std::string_view s) { return Parse<CollOp>(kOpNames, s); }
DType ParseDType(std::string_view s) { return Parse<DType>(kDTypeNames, s); }
SendCompletion ParseSendCompletion(std::string_view s) { return Parse<SendCompletion>(kSendCompletionNames, s); }
int DTypeSize(DType t) {
  size_t i = static_cast<size_t>(t);
  return i < kDTypeSizes.size() ? kDTypeSizes[i] : 0;
}

}  // namespace prism::trace
