// Per-process GPU memory for context switching (swap_scheduler.h, docs/collect.md "Footprint"): how much GPU memory
// each process uses as the driver counts it -- its CUDA context, the allocator's reservations, library workspaces --
// which is what a checkpoint moves and what a rank's footprint should be. libprism only sees the allocations it
// interposes, so without this the scheduler adds an assumed context size (--context-mem) to them.
//
// The source is NVML (libnvidia-ml.so.1, dlopen'ed: prism never links it, CI machines have no driver):
// nvmlDeviceGetComputeRunningProcesses_v3 on every device, usedGpuMemory per pid. A process missing from the answer
// (e.g. NVML reports host pids and the ranks run in a container's own pid namespace, with older drivers) or whose
// usage NVML does not know (NVML_VALUE_NOT_AVAILABLE) has no measurement, and its footprint follows the assumed rule.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>

namespace prism::coord {

// Fills *by_pid with the GPU memory each process uses now, in bytes, summed over the devices it is on. False with
// *error when the source cannot answer now. Called from the coordinator's event-loop thread, outside its lock.
using GpuUsageFn = std::function<bool(std::map<int, uint64_t>* by_pid, std::string* error)>;

// NVML through dlopen(library) and nvmlInit_v2; an empty function with *error when the library cannot be loaded,
// lacks the entry points, or does not initialise.
GpuUsageFn OpenNvmlUsage(const std::string& library, std::string* error);

}  // namespace prism::coord
