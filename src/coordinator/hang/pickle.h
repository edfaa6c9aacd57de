// A small Python pickle codec: enough to write and read PyTorch Flight Recorder dumps (a pickled dict of str, int,
// float, bool, None, bytes, lists, tuples and dicts) without Python.
//
// Writing uses protocol 2 (what torch's C++ Pickler writes for FR dumps; every Python 3 reads it). Reading takes
// protocols 0-5 for those types, including the memo (BINPUT/BINGET/MEMOIZE: torch shares repeated strings and
// containers through it), FRAME, and the one kind of GLOBAL+REDUCE torch's Pickler emits for typed lists
// (torch.jit._pickle build_intlist/build_doublelist/build_boollist/build_stringlist/build_generic_list: read as the
// list itself). Anything else (class instances, tensors, other globals, persistent ids) is refused with an error
// naming the opcode and its offset. Never throws; malformed input gives an error, not a crash.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace prism::pickle {

struct Value;
using ValuePtr = std::shared_ptr<Value>;

struct Value {
  enum class Kind { kNone, kBool, kInt, kFloat, kStr, kBytes, kList, kTuple, kDict };
  Kind kind = Kind::kNone;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;                                  // kStr (UTF-8) and kBytes
  std::vector<ValuePtr> items;                    // kList, kTuple
  std::vector<std::pair<ValuePtr, ValuePtr>> dict;  // kDict, in insertion order

  static ValuePtr None();
  static ValuePtr Bool(bool v);
  static ValuePtr Int(int64_t v);
  static ValuePtr Float(double v);
  static ValuePtr Str(std::string v);
  static ValuePtr Bytes(std::string v);
  static ValuePtr List(std::vector<ValuePtr> v = {});
  static ValuePtr Tuple(std::vector<ValuePtr> v = {});
  static ValuePtr Dict();

  // kDict: appends (no check for an existing key).
  void Set(std::string key, ValuePtr v);
  // kDict with str keys: the value, or nullptr.
  const Value* Get(std::string_view key) const;
  bool IsNone() const { return kind == Kind::kNone; }
  // Python's repr, for messages and tests ("{'a': [1, 2.5, 'x']}").
  std::string Repr() const;
};

// Pickles `v` with protocol 2. Containers nested deeper than 1000 levels are written as None; kBytes is written as
// a latin-1 str (protocol 2 has no bytes opcode; FR dumps hold none).
std::string Dumps(const Value& v);

// Unpickles `data`; nullptr with *error ("offset 17: unsupported opcode 0x63 (GLOBAL builtins.set)").
ValuePtr Loads(std::string_view data, std::string* error);

}  // namespace prism::pickle
