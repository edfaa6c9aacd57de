// ncclGroupStart / ncclGroupEnd / ncclGroupSimulateEnd: nesting per thread; at the outermost end the group's
// operations on each stream run as one unit (core/submit.h).
#include <nccl.h>

#include "interpose/api.h"
#include "interpose/core/submit.h"

using namespace prism::interpose;

PRISM_API ncclResult_t ncclGroupStart() { return Guarded(ncclInternalError, [] { return GroupStart(); }); }
PRISM_API ncclResult_t ncclGroupEnd() { return Guarded(ncclInternalError, [] { return GroupEnd(); }); }
PRISM_API ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* simInfo) {
  return Guarded(ncclInternalError, [&] { return GroupSimulateEnd(simInfo); });
}

#define PRISM_ALIAS(name) __attribute__((alias(#name), visibility("default")))
extern "C" {
ncclResult_t pncclGroupStart() PRISM_ALIAS(ncclGroupStart);
ncclResult_t pncclGroupEnd() PRISM_ALIAS(ncclGroupEnd);
ncclResult_t pncclGroupSimulateEnd(ncclSimInfo_t*) PRISM_ALIAS(ncclGroupSimulateEnd);
}
