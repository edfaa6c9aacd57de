// dlsym: PyTorch's lazy driver stubs (ATen LazyNVRTC: cuDevicePrimaryCtxGetState, used by every device guard)
// look libcuda functions up on a libcuda handle, which LD_PRELOAD cannot interpose. For such lookups from
// non-NVIDIA code libprism returns its device-mapping replacements (core/driver_overrides.h).
//
// RTLD_NEXT and RTLD_DEFAULT lookups depend on the caller's object; they are passed on as tail calls so glibc
// sees the original return address (checked with objdump in tests/unit/exports_test.cc).
#include <dlfcn.h>

#include "interpose/api.h"
#include "interpose/core/driver_overrides.h"
#include "interpose/core/real_symbols.h"

using namespace prism::interpose;

namespace {

using DlsymFn = void* (*)(void*, const char*);

DlsymFn Real() {
  static DlsymFn fn = [] {
    static const char* const kVersions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17"};
    for (const char* v : kVersions) {
      if (void* p = dlvsym(RTLD_NEXT, "dlsym", v)) return reinterpret_cast<DlsymFn>(p);
    }
    return static_cast<DlsymFn>(nullptr);
  }();
  return fn;
}

__attribute__((noinline)) void* Lookup(void* handle, const char* name, const void* caller) {
  DlsymFn real = Real();
  void* p = real != nullptr ? real(handle, name) : nullptr;
  if (p == nullptr || name == nullptr || name[0] != 'c' || name[1] != 'u') return p;
  void* o = DriverOverrideBySymbol(name);
  if (o == nullptr || !AddressInObject(p, "libcuda.so") || !CallerWantsOverrides(caller)) return p;
  return o;
}

}  // namespace

PRISM_API void* dlsym(void* handle, const char* name) {
  if (handle == RTLD_NEXT || handle == RTLD_DEFAULT) return Real()(handle, name);  // tail call
  return Lookup(handle, name, __builtin_return_address(0));
}
