// The pickle codec (coordinator/hang/pickle.h): round trip of every supported type, byte-exact protocol-2 output for a
// small value (the bytes CPython writes), reading what CPython's pickle writes at protocols 0-5 (generated at test
// time when python3 is present), torch's typed-list GLOBAL, the memo, and refusal (not a crash) of anything else.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "coordinator/hang/pickle.h"

namespace prism::pickle {
namespace {

namespace fs = std::filesystem;

ValuePtr Sample() {
  auto d = Value::Dict();
  d->Set("version", Value::Str("2.10"));
  d->Set("n", Value::Int(0));
  d->Set("small", Value::Int(200));
  d->Set("mid", Value::Int(65535));
  d->Set("neg", Value::Int(-7));
  d->Set("i32", Value::Int(-2147483648LL));
  d->Set("big", Value::Int(1795951727674159393LL));
  d->Set("bigneg", Value::Int(-1795951727674159393LL));
  d->Set("min", Value::Int(INT64_MIN));
  d->Set("f", Value::Float(1.25));
  d->Set("t", Value::Bool(true));
  d->Set("none", Value::None());
  d->Set("utf8", Value::Str("r\xc3\xa9sum\xc3\xa9"));
  d->Set("sizes", Value::List({Value::List({Value::Int(1024), Value::Int(4)}), Value::List()}));
  d->Set("pg", Value::Tuple({Value::Str("0"), Value::Str("default_pg")}));
  d->Set("t1", Value::Tuple({Value::Int(1)}));
  d->Set("t4", Value::Tuple({Value::Int(1), Value::Int(2), Value::Int(3), Value::Int(4)}));
  d->Set("empty", Value::Tuple());
  return d;
}

TEST(Pickle, RoundTrip) {
  ValuePtr v = Sample();
  std::string bytes = Dumps(*v);
  ASSERT_GE(bytes.size(), 3u);
  EXPECT_EQ(static_cast<uint8_t>(bytes[0]), 0x80);
  EXPECT_EQ(bytes[1], 2);
  EXPECT_EQ(bytes.back(), '.');
  std::string err;
  ValuePtr back = Loads(bytes, &err);
  ASSERT_TRUE(back) << err;
  EXPECT_EQ(back->Repr(), v->Repr());
  EXPECT_EQ(back->Get("big")->i, 1795951727674159393LL);
  EXPECT_EQ(back->Get("bigneg")->i, -1795951727674159393LL);
  EXPECT_EQ(back->Get("min")->i, INT64_MIN);
  EXPECT_EQ(back->Get("neg")->i, -7);
  EXPECT_DOUBLE_EQ(back->Get("f")->f, 1.25);
  EXPECT_EQ(back->Get("nope"), nullptr);
}

// pickle.dumps({'a': [1, 2.5, 'x'], 'b': (True, None)}, protocol=2) in CPython 3.11, minus its memo (BINPUT)
// opcodes, which our writer does not emit.
TEST(Pickle, WritesWhatCPythonWrites) {
  auto d = Value::Dict();
  d->Set("a", Value::List({Value::Int(1), Value::Float(2.5), Value::Str("x")}));
  d->Set("b", Value::Tuple({Value::Bool(true), Value::None()}));
  const unsigned char bytes[] = {0x80, 0x02, '}', '(', 'X', 1, 0, 0, 0, 'a', ']', '(', 'K', 1, 'G', 0x40, 0x04,
                                 0, 0, 0, 0, 0, 0, 'X', 1, 0, 0, 0, 'x', 'e', 'X', 1, 0, 0, 0, 'b', 0x88, 'N',
                                 0x86, 'u', '.'};
  std::string expect(reinterpret_cast<const char*>(bytes), sizeof(bytes));
  EXPECT_EQ(Dumps(*d), expect);
}

TEST(Pickle, MemoSharesContainers) {
  // [[], BINGET 0] where the shared list is filled after being memoized: both entries see the items.
  std::string p("\x80\x02](]q\x01h\x01" "e", 10);  // outer list, MARK, inner list memo 1, get 1, APPENDS
  p += std::string("h\x01K\x05" "a", 5);             // append 5 to the inner list (through the memo)
  p += "0.";                                         // POP the inner list, STOP with the outer one
  std::string err;
  ValuePtr v = Loads(p, &err);
  ASSERT_TRUE(v) << err;
  EXPECT_EQ(v->Repr(), "[[5], [5]]");
}

TEST(Pickle, TorchTypedListGlobal) {
  // torch's Pickler for an int list: GLOBAL 'torch.jit._pickle build_intlist', (MARK EMPTY_LIST MARK 1 2 APPENDS
  // TUPLE) REDUCE.
  std::string p = "\x80\x02" "ctorch.jit._pickle\nbuild_intlist\n(](K\x01K\x02" "etR.";
  std::string err;
  ValuePtr v = Loads(p, &err);
  ASSERT_TRUE(v) << err;
  EXPECT_EQ(v->Repr(), "[1, 2]");
}

TEST(Pickle, RefusesWhatItDoesNotKnow) {
  std::string err;
  EXPECT_FALSE(Loads("\x80\x02" "cos\nsystem\n.", &err));
  EXPECT_NE(err.find("unsupported global os.system"), std::string::npos) << err;
  EXPECT_FALSE(Loads("\x80\x09N.", &err));
  EXPECT_NE(err.find("protocol 9"), std::string::npos) << err;
  EXPECT_FALSE(Loads("\x80\x02X\xff\xff\xff\x7f" "abc", &err));
  EXPECT_NE(err.find("truncated"), std::string::npos) << err;
  EXPECT_FALSE(Loads("\x80\x02h\x05.", &err));
  EXPECT_NE(err.find("memo 5"), std::string::npos) << err;
  EXPECT_FALSE(Loads("\x80\x02K\x01", &err));
  EXPECT_NE(err.find("ends before STOP"), std::string::npos) << err;
  EXPECT_FALSE(Loads("\x80\x02" "a.", &err));
  EXPECT_NE(err.find("underflow"), std::string::npos) << err;
  // Random bytes never crash the reader.
  std::mt19937 rng(7);
  for (int i = 0; i < 20000; ++i) {
    std::string junk(rng() % 64, '\0');
    for (char& c : junk) c = static_cast<char>(rng());
    if (rng() % 2) junk = "\x80\x02" + junk;
    Loads(junk, &err);
  }
}

// What CPython writes: the same dict at every protocol, read back and compared by repr with what Python prints.
TEST(Pickle, ReadsCPythonPickles) {
  if (std::system("python3 -c 'import pickle' >/dev/null 2>&1") != 0) GTEST_SKIP() << "python3 not found";
  fs::path dir = fs::temp_directory_path() / ("prism-pickle-" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::string script = R"PY(
import pickle, sys
shared = [1, 2]
v = {'version': '2.10', 'ints': [0, 1, 255, 256, 65535, 65536, -1, -2**31, 2**31, 2**62, -2**63],
     'f': [0.5, -3.25, 1e300], 'b': [True, False, None], 's': 'r\u00e9sum\u00e9', 'e': '',
     't': (), 't1': ('x',), 't3': (1, 2, 3), 't5': (1, 2, 3, 4, 5), 'nested': {'k': [[1], [2, [3]]]},
     'shared': [shared, shared], 'bytes': b'\x00\x01ab', 'many': list(range(1500))}
for p in range(0, 6):
    w = dict(v)
    if p < 3:
        del w['bytes']  # protocols 0-2 pickle bytes through a _codecs global: refused (RefusesWhatItDoesNotKnow)
    with open(sys.argv[1] + '/p%d.pkl' % p, 'wb') as f:
        pickle.dump(w, f, protocol=p)
)PY";
  std::ofstream(dir / "gen.py") << script;
  ASSERT_EQ(std::system(("python3 " + (dir / "gen.py").string() + " " + dir.string()).c_str()), 0);
  for (int p = 0; p <= 5; ++p) {
    std::ifstream in(dir / ("p" + std::to_string(p) + ".pkl"), std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    std::string err;
    ValuePtr v = Loads(ss.str(), &err);
    ASSERT_TRUE(v) << "protocol " << p << ": " << err;
    EXPECT_EQ(v->Get("version")->s, "2.10");
    const Value* ints = v->Get("ints");
    ASSERT_TRUE(ints);
    ASSERT_EQ(ints->items.size(), 11u);
    EXPECT_EQ(ints->items[7]->i, -2147483648LL);
    EXPECT_EQ(ints->items[9]->i, 1LL << 62);
    EXPECT_EQ(ints->items[10]->i, INT64_MIN);
    EXPECT_EQ(v->Get("s")->s, "r\xc3\xa9sum\xc3\xa9");
    EXPECT_EQ(v->Get("t5")->Repr(), "(1, 2, 3, 4, 5)");
    EXPECT_EQ(v->Get("t1")->Repr(), "('x',)");
    EXPECT_EQ(v->Get("nested")->Repr(), "{'k': [[1], [2, [3]]]}");
    EXPECT_EQ(v->Get("shared")->Repr(), "[[1, 2], [1, 2]]");
    EXPECT_EQ(v->Get("b")->Repr(), "[True, False, None]");
    EXPECT_EQ(v->Get("many")->items.size(), 1500u);
    EXPECT_DOUBLE_EQ(v->Get("f")->items[2]->f, 1e300);
    if (p >= 3) {
      EXPECT_EQ(v->Get("bytes")->s, std::string("\x00\x01" "ab", 4));
    }
  }
  // And the other way: Python reads what we write, and sees the same value.
  std::ofstream(dir / "ours.pkl", std::ios::binary) << Dumps(*Sample());
  std::string check = "import pickle,sys; v=pickle.load(open(sys.argv[1],'rb')); "
                      "assert v['big']==1795951727674159393 and v['min']==-2**63 and v['pg']==('0','default_pg') "
                      "and v['utf8']=='r\\u00e9sum\\u00e9' and v['sizes']==[[1024,4],[]] and v['t4']==(1,2,3,4), v";
  std::ofstream(dir / "check.py") << check;
  EXPECT_EQ(std::system(("python3 " + (dir / "check.py").string() + " " + (dir / "ours.pkl").string()).c_str()), 0);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace prism::pickle
