// libprism.so's dynamic interface, checked on the built library: it exports every function nccl.h declares (and
// every NCCL symbol libtorch_cuda.so imports), links no CUDA or NCCL library, forwards caller-dependent dlsym
// lookups as tail calls, and behaves (error codes, no crash) in a process without a GPU.
#include <dlfcn.h>
#include <nccl.h>
#include <sys/wait.h>

#include <cctype>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

namespace {

const std::string kLib = std::string(PRISM_BINARY_DIR) + "/lib/libprism.so";

std::string Shell(const std::string& cmd, int* status = nullptr) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  int st = pclose(p);
  if (status) *status = st;
  return out;
}

std::set<std::string> DefinedDynamicSymbols() {
  std::set<std::string> names;
  std::istringstream in(Shell("nm -D --defined-only '" + kLib + "' 2>/dev/null"));
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string addr, type, name;
    if (f >> addr >> type >> name) names.insert(name.substr(0, name.find('@')));
  }
  return names;
}

// Function names declared in nccl.h (both the ncclX API and NCCL's pncclX profiling aliases).
std::set<std::string> NcclHeaderFunctions() {
  std::ifstream in(PRISM_NCCL_HEADER);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  std::set<std::string> names;
  std::regex decl(R"((?:^|\n)\s*(?:ncclResult_t|const\s+char\s*\*|void)\s+(p?nccl[A-Za-z0-9_]+)\s*\()");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), decl); it != std::sregex_iterator(); ++it) {
    names.insert((*it)[1]);
  }
  return names;
}

// NCCL symbols libtorch_cuda.so (torch 2.11) imports: `nm -D --undefined-only` on the GPU machine
// (shared/reference/gpu-machine-findings.md).
const char* const kTorchImports[] = {
    "ncclAllGather", "ncclAllReduce", "ncclAlltoAll", "ncclBcast", "ncclBroadcast", "ncclCommAbort",
    "ncclCommCount", "ncclCommDeregister", "ncclCommDestroy", "ncclCommFinalize", "ncclCommGetAsyncError",
    "ncclCommInitAll", "ncclCommInitRank", "ncclCommInitRankConfig", "ncclCommInitRankScalable",
    "ncclCommRegister", "ncclCommShrink", "ncclCommSplit", "ncclCommUserRank", "ncclCommWindowDeregister",
    "ncclCommWindowRegister", "ncclDevCommCreate", "ncclDevCommDestroy", "ncclGetErrorString", "ncclGetLastError",
    "ncclGetUniqueId", "ncclGetVersion", "ncclGroupEnd", "ncclGroupSimulateEnd", "ncclGroupStart", "ncclMemAlloc",
    "ncclMemFree", "ncclRecv", "ncclRedOpCreatePreMulSum", "ncclRedOpDestroy", "ncclReduce", "ncclReduceScatter",
    "ncclSend"};

// CUDA runtime entry points the shim must own for device virtualisation and memory accounting.
const char* const kCudaOwned[] = {
    "cudaGetDeviceCount", "cudaSetDevice", "cudaGetDevice", "cudaGetDeviceProperties", "cudaDeviceGetAttribute",
    "cudaDeviceGetPCIBusId", "cudaDeviceGetByPCIBusId", "cudaDeviceCanAccessPeer", "cudaDeviceEnablePeerAccess",
    "cudaPointerGetAttributes", "cudaGetDriverEntryPoint", "cudaGetDriverEntryPointByVersion", "cudaMalloc",
    "cudaFree", "cudaMallocAsync", "cudaFreeAsync", "dlsym", "cuDeviceGet", "cuDeviceGetAttribute",
    "cuDevicePrimaryCtxGetState", "cuCtxGetDevice", "cuMemCreate", "cuMemRelease"};

TEST(Exports, EveryNcclHeaderFunctionIsExported) {
  std::set<std::string> header = NcclHeaderFunctions();
  ASSERT_GT(header.size(), 70u) << "could not parse " << PRISM_NCCL_HEADER;
  ASSERT_TRUE(header.count("ncclAllReduce") && header.count("pncclAllReduce"));
  std::set<std::string> exported = DefinedDynamicSymbols();
  ASSERT_FALSE(exported.empty()) << "nm -D found nothing in " << kLib;
  for (const std::string& n : header) EXPECT_TRUE(exported.count(n)) << n << " (declared in nccl.h) is not exported";
}

TEST(Exports, EverySymbolTorchImportsIsExported) {
  std::set<std::string> exported = DefinedDynamicSymbols();
  for (const char* n : kTorchImports) EXPECT_TRUE(exported.count(n)) << n << " (imported by libtorch_cuda)";
  for (const char* n : kCudaOwned) EXPECT_TRUE(exported.count(n)) << n;
}

TEST(Exports, NothingButTheInterposedApisIsExported) {
  for (const std::string& n : DefinedDynamicSymbols()) {
    bool ok = n.rfind("nccl", 0) == 0 || n.rfind("pnccl", 0) == 0 || n.rfind("prism_", 0) == 0 ||
              n.rfind("cuda", 0) == 0 || n == "dlsym" || (n.size() > 2 && n.rfind("cu", 0) == 0 && std::isupper(n[2]));
    EXPECT_TRUE(ok) << "unexpected export " << n << " (spdlog/fmt/json/C++ must stay local)";
  }
}

TEST(Exports, NoCudaOrNcclLibraryIsLinked) {
  std::string dyn = Shell("readelf -d '" + kLib + "' 2>/dev/null");
  ASSERT_NE(dyn.find("NEEDED"), std::string::npos) << "readelf failed on " << kLib;
  for (const char* bad : {"libcudart", "libnccl", "libcuda.", "libstdc++"}) {
    EXPECT_EQ(dyn.find(bad), std::string::npos) << kLib << " has DT_NEEDED on " << bad;
  }
}

// RTLD_NEXT/RTLD_DEFAULT lookups are resolved relative to the caller; our dlsym must jump (not call) into glibc's.
TEST(Exports, DlsymForwardsAsTailCall) {
  std::string dis = Shell("objdump -d --no-show-raw-insn '" + kLib + "' 2>/dev/null | awk '/<dlsym>:/,/^$/'");
  if (dis.empty()) GTEST_SKIP() << "objdump not available";
  // Through a register (RelWithDebInfo) or straight through the cached pointer in memory (-O3 builds).
  EXPECT_TRUE(std::regex_search(dis, std::regex(R"(jmp\s+\*(%r|-?0x[0-9a-f]+\(%rip\)))"))) << dis;
}

class Loaded : public ::testing::Test {
 protected:
  void SetUp() override {
    handle_ = dlopen(kLib.c_str(), RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(handle_, nullptr) << dlerror();
  }
  template <typename F>
  F Fn(const char* name) {
    void* p = dlsym(handle_, name);
    EXPECT_NE(p, nullptr) << name;
    return reinterpret_cast<F>(p);
  }
  void* handle_ = nullptr;
};

// Without a GPU or CUDA libraries, every entry point answers with NCCL's/CUDA's own error codes.
TEST_F(Loaded, ErrorsWithoutAGpu) {
  auto err = Fn<const char* (*)(ncclResult_t)>("ncclGetErrorString");
  EXPECT_STREQ(err(ncclSuccess), "no error");
  EXPECT_NE(std::string(err(ncclInvalidArgument)).find("invalid argument"), std::string::npos);
  auto count = Fn<ncclResult_t (*)(ncclComm_t, int*)>("ncclCommCount");
  int n = 0;
  EXPECT_EQ(count(nullptr, &n), ncclInvalidArgument);
  int bogus[16] = {0};
  EXPECT_EQ(count(reinterpret_cast<ncclComm_t>(bogus), &n), ncclInvalidArgument);
  auto uid = Fn<ncclResult_t (*)(ncclUniqueId*)>("ncclGetUniqueId");
  ncclUniqueId id;
  EXPECT_EQ(uid(&id), ncclSuccess);
  EXPECT_EQ(std::memcmp(id.internal, "PRISMRID", 8), 0);
  auto version = Fn<ncclResult_t (*)(int*)>("ncclGetVersion");
  int v = 0;
  EXPECT_EQ(version(&v), ncclSuccess);
  EXPECT_GE(v, 22800);
  auto group_end = Fn<ncclResult_t (*)()>("ncclGroupEnd");
  EXPECT_EQ(group_end(), ncclInvalidUsage);
  auto destroy = Fn<ncclResult_t (*)(ncclComm_t)>("ncclCommDestroy");
  EXPECT_EQ(destroy(nullptr), ncclSuccess);
  auto init = Fn<ncclResult_t (*)(ncclComm_t*, int, ncclUniqueId, int)>("ncclCommInitRank");
  ncclComm_t comm = nullptr;
  EXPECT_EQ(init(&comm, 4, id, 7), ncclInvalidArgument);  // rank >= nranks
  EXPECT_EQ(init(&comm, 4, id, 1), ncclUnhandledCudaError);  // no GPU to gate on: NCCL's CUDA error code
  auto count_dev = Fn<int (*)(int*)>("cudaGetDeviceCount");
  int devs = 0;
  EXPECT_NE(count_dev(&devs), 0) << "no libcudart here: must report an error, not crash";
}

TEST(Exports, PreloadIntoAPlainProcessIsHarmless) {
  int st = 0;
  Shell("LD_PRELOAD='" + kLib + "' PRISM_GATE=bogus PRISM_RANK=3 /bin/sh -c 'exit 7'", &st);
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 7);
}

}  // namespace
