#include "coordinator/hang/pickle.h"

#include <cmath>
#include <cstring>
#include <unordered_map>

#include <fmt/format.h>

namespace prism::pickle {
namespace {

// Opcodes (CPython Lib/pickle.py).
enum : uint8_t {
  kMark = '(', kStop = '.', kPop = '0', kPopMark = '1', kDup = '2', kFloat = 'F', kInt = 'I', kBinInt = 'J',
  kBinInt1 = 'K', kLong = 'L', kBinInt2 = 'M', kNone = 'N', kPersId = 'P', kBinPersId = 'Q', kReduce = 'R',
  kString = 'S', kBinString = 'T', kShortBinString = 'U', kUnicode = 'V', kBinUnicode = 'X', kAppend = 'a',
  kBuild = 'b', kGlobal = 'c', kDict = 'd', kEmptyDict = '}', kAppends = 'e', kGet = 'g', kBinGet = 'h',
  kInst = 'i', kLongBinGet = 'j', kList = 'l', kEmptyList = ']', kObj = 'o', kPut = 'p', kBinPut = 'q',
  kLongBinPut = 'r', kSetItem = 's', kTuple = 't', kEmptyTuple = ')', kSetItems = 'u', kBinFloat = 'G',
  kProto = 0x80, kNewObj = 0x81, kTuple1 = 0x85, kTuple2 = 0x86, kTuple3 = 0x87, kNewTrue = 0x88,
  kNewFalse = 0x89, kLong1 = 0x8a, kLong4 = 0x8b, kBinBytes = 'B', kShortBinBytes = 'C', kShortBinUnicode = 0x8c,
  kBinUnicode8 = 0x8d, kBinBytes8 = 0x8e, kEmptySet = 0x8f, kAddItems = 0x90, kFrozenSet = 0x91, kStackGlobal = 0x93,
  kMemoize = 0x94, kFrame = 0x95,
};

constexpr int kMaxDepth = 1000;

ValuePtr Make(Value::Kind k) {
  auto v = std::make_shared<Value>();
  v->kind = k;
  return v;
}

void PutU32(std::string* o, uint32_t v) {
  for (int i = 0; i < 4; ++i) o->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void WriteInt(std::string* o, int64_t v) {
  if (v >= 0 && v <= 0xff) {
    o->push_back(static_cast<char>(kBinInt1));
    o->push_back(static_cast<char>(v));
  } else if (v >= 0 && v <= 0xffff) {
    o->push_back(static_cast<char>(kBinInt2));
    o->push_back(static_cast<char>(v & 0xff));
    o->push_back(static_cast<char>((v >> 8) & 0xff));
  } else if (v >= INT32_MIN && v <= INT32_MAX) {
    o->push_back(static_cast<char>(kBinInt));
    PutU32(o, static_cast<uint32_t>(static_cast<int32_t>(v)));
  } else {
    // LONG1: little-endian two's complement, as few bytes as keep the sign.
    std::string bytes;
    uint64_t u = static_cast<uint64_t>(v);
    for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
    while (bytes.size() > 1) {
      auto last = static_cast<uint8_t>(bytes.back());
      auto prev = static_cast<uint8_t>(bytes[bytes.size() - 2]);
      if ((last == 0 && !(prev & 0x80)) || (last == 0xff && (prev & 0x80))) {
        bytes.pop_back();
      } else {
        break;
      }
    }
    o->push_back(static_cast<char>(kLong1));
    o->push_back(static_cast<char>(bytes.size()));
    *o += bytes;
  }
}

void Write(const Value& v, std::string* o, int depth) {
  if (depth > kMaxDepth) {
    o->push_back(static_cast<char>(kNone));
    return;
  }
  switch (v.kind) {
    case Value::Kind::kNone: o->push_back(static_cast<char>(kNone)); return;
    case Value::Kind::kBool: o->push_back(static_cast<char>(v.b ? kNewTrue : kNewFalse)); return;
    case Value::Kind::kInt: WriteInt(o, v.i); return;
    case Value::Kind::kFloat: {
      o->push_back(static_cast<char>(kBinFloat));
      uint64_t bits;
      std::memcpy(&bits, &v.f, 8);
      for (int i = 7; i >= 0; --i) o->push_back(static_cast<char>((bits >> (8 * i)) & 0xff));  // big-endian
      return;
    }
    case Value::Kind::kStr:
      o->push_back(static_cast<char>(kBinUnicode));
      PutU32(o, static_cast<uint32_t>(v.s.size()));
      *o += v.s;
      return;
    case Value::Kind::kBytes:
      // Why SHORT_BINSTRING/BINSTRING-free: protocol 2 has no bytes opcode; Python 3 pickles bytes at protocol 2 as
      // _codecs.encode(str, 'latin1'), which we do not want to emit. Bytes are written as latin-1 str instead.
      o->push_back(static_cast<char>(kBinUnicode));
      {
        std::string utf8;
        for (unsigned char c : v.s) {
          if (c < 0x80) {
            utf8.push_back(static_cast<char>(c));
          } else {
            utf8.push_back(static_cast<char>(0xc0 | (c >> 6)));
            utf8.push_back(static_cast<char>(0x80 | (c & 0x3f)));
          }
        }
        PutU32(o, static_cast<uint32_t>(utf8.size()));
        *o += utf8;
      }
      return;
    case Value::Kind::kList:
      o->push_back(static_cast<char>(kEmptyList));
      if (!v.items.empty()) {
        o->push_back(static_cast<char>(kMark));
        for (const auto& x : v.items) Write(x ? *x : Value{}, o, depth + 1);
        o->push_back(static_cast<char>(kAppends));
      }
      return;
    case Value::Kind::kTuple:
      if (v.items.empty()) {
        o->push_back(static_cast<char>(kEmptyTuple));
        return;
      }
      if (v.items.size() > 3) o->push_back(static_cast<char>(kMark));
      for (const auto& x : v.items) Write(x ? *x : Value{}, o, depth + 1);
      o->push_back(static_cast<char>(v.items.size() == 1   ? kTuple1
                                     : v.items.size() == 2 ? kTuple2
                                     : v.items.size() == 3 ? kTuple3
                                                           : kTuple));
      return;
    case Value::Kind::kDict:
      o->push_back(static_cast<char>(kEmptyDict));
      if (!v.dict.empty()) {
        o->push_back(static_cast<char>(kMark));
        for (const auto& [k, x] : v.dict) {
          Write(k ? *k : Value{}, o, depth + 1);
          Write(x ? *x : Value{}, o, depth + 1);
        }
        o->push_back(static_cast<char>(kSetItems));
      }
      return;
  }
}

std::string ReprStr(std::string_view s) {
  std::string o = "'";
  for (unsigned char c : s) {
    if (c == '\'' || c == '\\') {
      o.push_back('\\');
      o.push_back(static_cast<char>(c));
    } else if (c == '\n') {
      o += "\\n";
    } else if (c < 0x20) {
      o += fmt::format("\\x{:02x}", c);
    } else {
      o.push_back(static_cast<char>(c));
    }
  }
  return o + "'";
}

std::string Repr(const Value& v, int depth) {
  if (depth > 64) return "...";
  switch (v.kind) {
    case Value::Kind::kNone: return "None";
    case Value::Kind::kBool: return v.b ? "True" : "False";
    case Value::Kind::kInt: return std::to_string(v.i);
    case Value::Kind::kFloat: {
      if (std::isfinite(v.f) && v.f == std::floor(v.f) && std::fabs(v.f) < 1e16) return fmt::format("{:.1f}", v.f);
      return fmt::format("{}", v.f);
    }
    case Value::Kind::kStr: return ReprStr(v.s);
    case Value::Kind::kBytes: return "b" + ReprStr(v.s);
    case Value::Kind::kList:
    case Value::Kind::kTuple: {
      bool list = v.kind == Value::Kind::kList;
      std::string o = list ? "[" : "(";
      for (size_t i = 0; i < v.items.size(); ++i) {
        if (i) o += ", ";
        o += v.items[i] ? Repr(*v.items[i], depth + 1) : "None";
      }
      if (!list && v.items.size() == 1) o += ",";
      return o + (list ? "]" : ")");
    }
    case Value::Kind::kDict: {
      std::string o = "{";
      for (size_t i = 0; i < v.dict.size(); ++i) {
        if (i) o += ", ";
        o += (v.dict[i].first ? Repr(*v.dict[i].first, depth + 1) : "None") + ": " +
             (v.dict[i].second ? Repr(*v.dict[i].second, depth + 1) : "None");
      }
      return o + "}";
    }
  }
  return "?";
}

void Utf8(uint32_t cp, std::string* o) {
  if (cp < 0x80) {
    o->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    o->push_back(static_cast<char>(0xc0 | (cp >> 6)));
    o->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else if (cp < 0x10000) {
    o->push_back(static_cast<char>(0xe0 | (cp >> 12)));
    o->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    o->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else {
    o->push_back(static_cast<char>(0xf0 | ((cp >> 18) & 0x07)));
    o->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
    o->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    o->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  }
}

// Protocol 0's UNICODE argument: latin-1 bytes with \uXXXX and \UXXXXXXXX escapes, to UTF-8.
std::string RawUnicodeEscape(const std::string& in) {
  std::string o;
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] == '\\' && i + 1 < in.size() && (in[i + 1] == 'u' || in[i + 1] == 'U')) {
      size_t n = in[i + 1] == 'u' ? 4 : 8;
      if (i + 2 + n <= in.size()) {
        try {
          size_t used = 0;
          unsigned long cp = std::stoul(in.substr(i + 2, n), &used, 16);
          if (used == n) {
            Utf8(static_cast<uint32_t>(cp), &o);
            i += 1 + n;
            continue;
          }
        } catch (...) {
        }
      }
    }
    Utf8(static_cast<unsigned char>(in[i]), &o);
  }
  return o;
}

class Reader {
 public:
  explicit Reader(std::string_view d) : d_(d) {}

  ValuePtr Run(std::string* error) {
    while (pos_ < d_.size()) {
      size_t at = pos_;
      uint8_t op = static_cast<uint8_t>(d_[pos_++]);
      if (op == kStop) {
        if (stack_.empty()) return Fail(at, "STOP with an empty stack", error);
        return stack_.back();
      }
      if (!Step(op, at)) {
        *error = err_;
        return nullptr;
      }
    }
    *error = fmt::format("offset {}: the data ends before STOP", pos_);
    return nullptr;
  }

 private:
  ValuePtr Fail(size_t at, const std::string& what, std::string* error) {
    *error = fmt::format("offset {}: {}", at, what);
    return nullptr;
  }
  bool Bad(size_t at, const std::string& what) {
    err_ = fmt::format("offset {}: {}", at, what);
    return false;
  }
  bool Need(size_t n, size_t at) {
    if (d_.size() - pos_ < n) return Bad(at, fmt::format("truncated (needs {} more bytes)", n));
    return true;
  }
  uint64_t Le(size_t n) {
    uint64_t v = 0;
    for (size_t i = 0; i < n; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(d_[pos_ + i])) << (8 * i);
    pos_ += n;
    return v;
  }
  // Need, then Le.
  bool ReadLe(size_t at, size_t n, uint64_t* v) {
    if (!Need(n, at)) return false;
    *v = Le(n);
    return true;
  }
  bool Line(size_t at, std::string* out) {
    size_t nl = d_.find('\n', pos_);
    if (nl == std::string_view::npos) return Bad(at, "truncated text argument");
    *out = std::string(d_.substr(pos_, nl - pos_));
    pos_ = nl + 1;
    return true;
  }
  bool Push(ValuePtr v) {
    if (stack_.size() > (1u << 24)) return Bad(pos_, "stack too deep");
    stack_.push_back(std::move(v));
    return true;
  }
  bool Pop(size_t at, ValuePtr* out) {
    if (stack_.empty() || (!marks_.empty() && stack_.size() <= marks_.back())) return Bad(at, "stack underflow");
    *out = std::move(stack_.back());
    stack_.pop_back();
    return true;
  }
  bool PopMark(size_t at, std::vector<ValuePtr>* out) {
    if (marks_.empty()) return Bad(at, "no MARK");
    size_t m = marks_.back();
    marks_.pop_back();
    out->assign(std::make_move_iterator(stack_.begin() + static_cast<long>(m)),
                std::make_move_iterator(stack_.end()));
    stack_.resize(m);
    return true;
  }
  bool Top(size_t at, ValuePtr** out) {
    if (stack_.empty() || (!marks_.empty() && stack_.size() <= marks_.back())) return Bad(at, "stack underflow");
    *out = &stack_.back();
    return true;
  }
  bool Memo(size_t at, uint64_t id) {
    ValuePtr* top = nullptr;
    if (!Top(at, &top)) return false;
    memo_[id] = *top;
    return true;
  }
  bool Recall(size_t at, uint64_t id) {
    auto it = memo_.find(id);
    if (it == memo_.end()) return Bad(at, fmt::format("memo {} was never stored", id));
    return Push(it->second);
  }
  bool Str(size_t at, size_t n, Value::Kind kind) {
    if (!Need(n, at)) return false;
    auto v = Make(kind);
    v->s = std::string(d_.substr(pos_, n));
    pos_ += n;
    return Push(v);
  }
  // PUT's and GET's argument: a memo index as text on its own line, handed to `use`.
  template <typename Use>
  bool MemoLine(size_t at, const char* op, Use use) {
    std::string s;
    if (!Line(at, &s)) return false;
    try {
      return use(std::stoull(s));
    } catch (...) {
      return Bad(at, fmt::format("bad {} '{}'", op, s));
    }
  }
  // A string whose length comes first, in `len_bytes` little-endian bytes.
  bool SizedStr(size_t at, size_t len_bytes, Value::Kind kind) {
    uint64_t len = 0;
    return ReadLe(at, len_bytes, &len) && Str(at, len, kind);
  }
  bool AddTo(size_t at, const ValuePtr& target, std::vector<ValuePtr> items) {
    if (target->kind != Value::Kind::kList) return Bad(at, "APPEND to something that is not a list");
    for (auto& x : items) target->items.push_back(std::move(x));
    return true;
  }
  bool SetIn(size_t at, const ValuePtr& target, std::vector<ValuePtr> kv) {
    if (target->kind != Value::Kind::kDict) return Bad(at, "SETITEM on something that is not a dict");
    if (kv.size() % 2) return Bad(at, "SETITEMS with an odd number of values");
    for (size_t i = 0; i < kv.size(); i += 2) target->dict.emplace_back(std::move(kv[i]), std::move(kv[i + 1]));
    return true;
  }

  bool Step(uint8_t op, size_t at) {
    switch (op) {
      case kProto: {
        if (!Need(1, at)) return false;
        uint8_t v = static_cast<uint8_t>(d_[pos_++]);
        if (v > 5) return Bad(at, fmt::format("pickle protocol {} (this reader knows 0-5)", v));
        return true;
      }
      case kFrame:
        if (!Need(8, at)) return false;
        pos_ += 8;
        return true;
      case kMark:
        marks_.push_back(stack_.size());
        return true;
      case kPop: {
        if (!marks_.empty() && marks_.back() == stack_.size()) {
          marks_.pop_back();  // POP of a bare mark, as pickle.py does
          return true;
        }
        ValuePtr x;
        return Pop(at, &x);
      }
      case kPopMark: {
        std::vector<ValuePtr> x;
        return PopMark(at, &x);
      }
      case kDup: {
        ValuePtr* t = nullptr;
        if (!Top(at, &t)) return false;
        ValuePtr copy = *t;
        return Push(copy);
      }
      case kNone: return Push(Value::None());
      case kNewTrue: return Push(Value::Bool(true));
      case kNewFalse: return Push(Value::Bool(false));
      case kBinInt1:
        if (!Need(1, at)) return false;
        return Push(Value::Int(static_cast<int64_t>(Le(1))));
      case kBinInt2:
        if (!Need(2, at)) return false;
        return Push(Value::Int(static_cast<int64_t>(Le(2))));
      case kBinInt:
        if (!Need(4, at)) return false;
        return Push(Value::Int(static_cast<int32_t>(static_cast<uint32_t>(Le(4)))));
      case kLong1:
      case kLong4: {
        size_t w = op == kLong1 ? 1 : 4;
        if (!Need(w, at)) return false;
        uint64_t n = Le(w);
        if (n > 8) {
          if (!Need(n, at)) return false;
          return Bad(at, fmt::format("integer of {} bytes (more than 64 bits)", n));
        }
        if (!Need(n, at)) return false;
        uint64_t u = Le(n);
        if (n > 0 && n < 8 && (u >> (8 * n - 1)) & 1) u |= ~uint64_t{0} << (8 * n);  // sign-extend
        return Push(Value::Int(static_cast<int64_t>(u)));
      }
      case kInt:
      case kLong: {
        std::string s;
        if (!Line(at, &s)) return false;
        if (op == kLong && !s.empty() && s.back() == 'L') s.pop_back();
        if (op == kInt && (s == "00" || s == "01")) return Push(Value::Bool(s == "01"));
        try {
          size_t used = 0;
          long long v = std::stoll(s, &used);
          if (used != s.size()) return Bad(at, "bad integer '" + s + "'");
          return Push(Value::Int(v));
        } catch (...) {
          return Bad(at, "bad integer '" + s + "'");
        }
      }
      case kBinFloat: {
        if (!Need(8, at)) return false;
        uint64_t bits = 0;
        for (int i = 0; i < 8; ++i) bits = (bits << 8) | static_cast<uint8_t>(d_[pos_ + static_cast<size_t>(i)]);
        pos_ += 8;
        double f;
        std::memcpy(&f, &bits, 8);
        return Push(Value::Float(f));
      }
      case kFloat: {
        std::string s;
        if (!Line(at, &s)) return false;
        try {
          return Push(Value::Float(std::stod(s)));
        } catch (...) {
          return Bad(at, "bad float '" + s + "'");
        }
      }
      case kBinUnicode: return SizedStr(at, 4, Value::Kind::kStr);
      case kShortBinUnicode: return SizedStr(at, 1, Value::Kind::kStr);
      case kBinUnicode8: return SizedStr(at, 8, Value::Kind::kStr);
      case kUnicode: {
        std::string s;
        if (!Line(at, &s)) return false;
        return Push(Value::Str(RawUnicodeEscape(s)));
      }
      case kBinBytes: return SizedStr(at, 4, Value::Kind::kBytes);
      case kShortBinBytes: return SizedStr(at, 1, Value::Kind::kBytes);
      case kBinBytes8: return SizedStr(at, 8, Value::Kind::kBytes);
      case kBinString: return SizedStr(at, 4, Value::Kind::kStr);  // Python 2 str: read as text
      case kShortBinString: return SizedStr(at, 1, Value::Kind::kStr);
      case kEmptyList: return Push(Value::List());
      case kEmptyDict: return Push(Value::Dict());
      case kEmptyTuple: return Push(Value::Tuple());
      case kEmptySet: return Push(Value::List());  // sets read as lists
      case kList:
      case kTuple:
      case kFrozenSet: {
        std::vector<ValuePtr> items;
        if (!PopMark(at, &items)) return false;
        return Push(op == kTuple ? Value::Tuple(std::move(items)) : Value::List(std::move(items)));
      }
      case kDict: {
        std::vector<ValuePtr> kv;
        if (!PopMark(at, &kv)) return false;
        auto d = Value::Dict();
        if (!SetIn(at, d, std::move(kv))) return false;
        return Push(d);
      }
      case kTuple1:
      case kTuple2:
      case kTuple3: {
        size_t n = op - kTuple1 + 1;
        std::vector<ValuePtr> items(n);
        for (size_t i = n; i-- > 0;) {
          if (!Pop(at, &items[i])) return false;
        }
        return Push(Value::Tuple(std::move(items)));
      }
      case kAppend: {
        ValuePtr x, *t = nullptr;
        if (!Pop(at, &x) || !Top(at, &t)) return false;
        return AddTo(at, *t, {x});
      }
      case kAppends:
      case kAddItems:
      case kSetItems: {
        std::vector<ValuePtr> items;
        ValuePtr* t = nullptr;
        if (!PopMark(at, &items) || !Top(at, &t)) return false;
        return op == kSetItems ? SetIn(at, *t, std::move(items)) : AddTo(at, *t, std::move(items));
      }
      case kSetItem: {
        ValuePtr k, v, *t = nullptr;
        if (!Pop(at, &v) || !Pop(at, &k) || !Top(at, &t)) return false;
        return SetIn(at, *t, {k, v});
      }
      case kBinPut:
      case kLongBinPut: {
        uint64_t id = 0;
        return ReadLe(at, op == kBinPut ? 1 : 4, &id) && Memo(at, id);
      }
      case kMemoize: return Memo(at, memo_.size());
      case kPut: return MemoLine(at, "PUT", [&](uint64_t id) { return Memo(at, id); });
      case kBinGet:
      case kLongBinGet: {
        uint64_t id = 0;
        return ReadLe(at, op == kBinGet ? 1 : 4, &id) && Recall(at, id);
      }
      case kGet: return MemoLine(at, "GET", [&](uint64_t id) { return Recall(at, id); });
      case kGlobal: {
        std::string mod, name;
        if (!Line(at, &mod) || !Line(at, &name)) return false;
        return Global(at, mod, name);
      }
      case kStackGlobal: {
        ValuePtr name, mod;
        if (!Pop(at, &name) || !Pop(at, &mod)) return false;
        if (mod->kind != Value::Kind::kStr || name->kind != Value::Kind::kStr) return Bad(at, "STACK_GLOBAL of non-str");
        return Global(at, mod->s, name->s);
      }
      case kReduce: {
        ValuePtr args, fn;
        if (!Pop(at, &args) || !Pop(at, &fn)) return false;
        // Only our own marker for a list builder gets here (Global refuses everything else).
        if (fn->kind != Value::Kind::kStr || fn->s != kListBuilder) return Bad(at, "REDUCE of an unsupported callable");
        if (args->kind != Value::Kind::kTuple || args->items.size() != 1 ||
            args->items[0]->kind != Value::Kind::kList) {
          return Bad(at, "torch.jit._pickle list builder without a list argument");
        }
        return Push(args->items[0]);
      }
      default:
        return Bad(at, fmt::format("unsupported opcode 0x{:02x}{}", op,
                                   op >= 0x20 && op < 0x7f ? fmt::format(" ('{}')", static_cast<char>(op)) : ""));
    }
  }

  bool Global(size_t at, const std::string& mod, const std::string& name) {
    if (mod == "torch.jit._pickle" && (name == "build_intlist" || name == "build_doublelist" ||
                                       name == "build_boollist" || name == "build_stringlist" ||
                                       name == "build_generic_list" || name == "build_tensorlist")) {
      return Push(Value::Str(kListBuilder));
    }
    return Bad(at, fmt::format("unsupported global {}.{}", mod, name));
  }

  static constexpr const char* kListBuilder = "\x01prism-list-builder";
  std::string_view d_;
  size_t pos_ = 0;
  std::vector<ValuePtr> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, ValuePtr> memo_;
  std::string err_;
};

}  // namespace

ValuePtr Value::None() { return Make(Kind::kNone); }
ValuePtr Value::Bool(bool v) {
  auto p = Make(Kind::kBool);
  p->b = v;
  return p;
}
ValuePtr Value::Int(int64_t v) {
  auto p = Make(Kind::kInt);
  p->i = v;
  return p;
}
ValuePtr Value::Float(double v) {
  auto p = Make(Kind::kFloat);
  p->f = v;
  return p;
}
ValuePtr Value::Str(std::string v) {
  auto p = Make(Kind::kStr);
  p->s = std::move(v);
  return p;
}
ValuePtr Value::Bytes(std::string v) {
  auto p = Make(Kind::kBytes);
  p->s = std::move(v);
  return p;
}
ValuePtr Value::List(std::vector<ValuePtr> v) {
  auto p = Make(Kind::kList);
  p->items = std::move(v);
  return p;
}
ValuePtr Value::Tuple(std::vector<ValuePtr> v) {
  auto p = Make(Kind::kTuple);
  p->items = std::move(v);
  return p;
}
ValuePtr Value::Dict() { return Make(Kind::kDict); }

void Value::Set(std::string key, ValuePtr v) { dict.emplace_back(Str(std::move(key)), std::move(v)); }

const Value* Value::Get(std::string_view key) const {
  if (kind != Kind::kDict) return nullptr;
  for (const auto& [k, v] : dict) {
    if (k && k->kind == Kind::kStr && k->s == key) return v.get();
  }
  return nullptr;
}

std::string Value::Repr() const { return pickle::Repr(*this, 0); }

std::string Dumps(const Value& v) {
  std::string o;
  o.push_back(static_cast<char>(kProto));
  o.push_back(2);
  Write(v, &o, 0);
  o.push_back(static_cast<char>(kStop));
  return o;
}

ValuePtr Loads(std::string_view data, std::string* error) {
  Reader r(data);
  return r.Run(error);
}

}  // namespace prism::pickle
