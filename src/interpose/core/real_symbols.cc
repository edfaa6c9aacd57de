#include "interpose/core/real_symbols.h"

#include <dlfcn.h>
#include <link.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace prism::interpose {
namespace {

using DlsymFn = void* (*)(void*, const char*);

DlsymFn ResolveRealDlsym() {
  // Why dlvsym: dlsym itself may be ours (dl_hooks.cc); dlvsym is never interposed. glibc >= 2.34 versions it
  // GLIBC_2.34, older ones GLIBC_2.2.5 (x86-64) / GLIBC_2.17 (aarch64).
  static const char* const kVersions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17"};
  for (const char* v : kVersions) {
    if (void* p = dlvsym(RTLD_NEXT, "dlsym", v)) return reinterpret_cast<DlsymFn>(p);
  }
  for (const char* v : kVersions) {
    if (void* p = dlvsym(RTLD_DEFAULT, "dlsym", v)) return reinterpret_cast<DlsymFn>(p);
  }
  return nullptr;
}

std::string SelfPath() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&ResolveRealDlsym), &info) != 0 && info.dli_fname) return info.dli_fname;
  return {};
}

struct FindCtx {
  const char* part;
  const std::string* self;
  std::string found;
};

int FindCallback(struct dl_phdr_info* info, size_t, void* data) {
  auto* ctx = static_cast<FindCtx*>(data);
  if (info->dlpi_name == nullptr || info->dlpi_name[0] == '\0') return 0;
  if (std::strstr(info->dlpi_name, ctx->part) == nullptr) return 0;
  if (*ctx->self == info->dlpi_name) return 0;
  ctx->found = info->dlpi_name;
  return 1;
}

}  // namespace

void* RealDlsym(void* handle, const char* name) {
  static DlsymFn fn = ResolveRealDlsym();
  return fn != nullptr ? fn(handle, name) : nullptr;
}

std::string FindLoadedObject(const char* part) {
  static const std::string self = SelfPath();
  FindCtx ctx{part, &self, {}};
  dl_iterate_phdr(&FindCallback, &ctx);
  return ctx.found;
}

void* LoadedLibraryHandle(const char* part) {
  std::string path = FindLoadedObject(part);
  if (path.empty()) return nullptr;
  return dlopen(path.c_str(), RTLD_NOLOAD | RTLD_LAZY);
}

void* LoadedSymbol(const char* part, const char* name) {
  void* h = LoadedLibraryHandle(part);
  return h != nullptr ? RealDlsym(h, name) : nullptr;
}

bool AddressInObject(const void* addr, const char* part) {
  Dl_info info{};
  if (addr == nullptr || dladdr(addr, &info) == 0 || info.dli_fname == nullptr) return false;
  return std::strstr(info.dli_fname, part) != nullptr;
}

const CudartFns& Cudart() {
  static const CudartFns* fns = [] {
    auto* f = new CudartFns();  // Why leaked: used until the very end of the process.
    void* h = LoadedLibraryHandle("libcudart.so");
    if (h == nullptr) return f;
#define PRISM_RESOLVE_CUDART(name) f->name = reinterpret_cast<decltype(f->name)>(RealDlsym(h, #name));
    PRISM_CUDART_FUNCS(PRISM_RESOLVE_CUDART)
#undef PRISM_RESOLVE_CUDART
#define PRISM_RESOLVE_TYPED(name, type) f->name = reinterpret_cast<type>(RealDlsym(h, #name));
    PRISM_CUDART_TYPED_FUNCS(PRISM_RESOLVE_TYPED)
#undef PRISM_RESOLVE_TYPED
    return f;
  }();
  return *fns;
}

bool NcclFns::Complete() const {
  bool ok = true;
#define PRISM_CHECK_NCCL(name) ok = ok && name != nullptr;
  PRISM_NCCL_FUNCS(PRISM_CHECK_NCCL)
#undef PRISM_CHECK_NCCL
  return ok;
}

const NcclFns& LoadedNccl() {
  static const NcclFns* fns = [] {
    auto* f = new NcclFns();  // Why leaked: used until the very end of the process.
    void* h = nullptr;
    const char* forced = std::getenv("PRISM_NCCL_LIBRARY");
    if (forced != nullptr && forced[0] != '\0') {
      h = dlopen(forced, RTLD_NOW | RTLD_LOCAL);
      if (h != nullptr) f->path = forced;
    } else {
      // Why only one already loaded: a job that loads no NCCL of its own (a test program linked against libprism)
      // has none to pass through to.
      f->path = FindLoadedObject("libnccl.so");
      h = f->path.empty() ? nullptr : dlopen(f->path.c_str(), RTLD_NOLOAD | RTLD_LAZY);
    }
    if (h == nullptr) {
      f->path.clear();
      return f;
    }
#define PRISM_RESOLVE_NCCL(name) f->name = reinterpret_cast<decltype(f->name)>(RealDlsym(h, #name));
    PRISM_NCCL_FUNCS(PRISM_RESOLVE_NCCL)
#undef PRISM_RESOLVE_NCCL
    return f;
  }();
  return *fns;
}

const DriverFns& LoadedDriver() {
  static const DriverFns* fns = [] {
    auto* f = new DriverFns();
    void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) return f;
    f->cuGetProcAddress = reinterpret_cast<decltype(f->cuGetProcAddress)>(RealDlsym(h, "cuGetProcAddress_v2"));
    if (f->cuGetProcAddress == nullptr) return f;
    CUdriverProcAddressQueryResult status;
#define PRISM_RESOLVE_DRIVER(name)                                                                   \
  {                                                                                                  \
    void* p = nullptr;                                                                               \
    if (f->cuGetProcAddress(#name, &p, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &status) == CUDA_SUCCESS) \
      f->name = reinterpret_cast<decltype(f->name)>(p);                                              \
  }
    PRISM_DRIVER_FUNCS(PRISM_RESOLVE_DRIVER)
#undef PRISM_RESOLVE_DRIVER
    f->loaded = true;
    return f;
  }();
  return *fns;
}

}  // namespace prism::interpose
