// Temporary: compiles src/common/ipc_io.cc into prism_coordinator until src/common/CMakeLists.txt lists it
// (request in /work/requests.md). Delete this file once prism_common builds ipc_io.cc.
#include "common/ipc_io.cc"  // NOLINT(bugprone-suspicious-include)
