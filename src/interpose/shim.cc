// libprism.so entry: the constructor only reads the environment (no CUDA, no sockets); heavy setup waits for
// first use (see ARCHITECTURE.md "Data flow", step 3).
#include <cstdlib>

#include "interpose/kernels.h"

extern "C" {

__attribute__((visibility("default"))) const char* prism_version() { return "0.1.0"; }

__attribute__((visibility("default"))) int prism_kernels_present() {
  return prism::interpose::FatbinPresent() ? 1 : 0;
}

}  // extern "C"
