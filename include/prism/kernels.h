// The kernel file of a real rank: $PRISM_OUT_DIR/rank<R>.kernels.jsonl, written by libprism when PRISM_KERNELS is
// set (src/interpose/core/kernel_trace.cc, CUPTI's activity API) and read by the launcher (src/launcher/kernel_report.h: trace.json
// and `prism-run report kernels`). Header-only and free of CUDA so both sides share the names. docs/kernels.md has
// the full format; in short, one JSON object per line (key "type"):
//
//   kernels {v, rank, pid, status:"on"|"off", why, cupti, cupti_version, kinds:[..]}  first line
//   sync    {host_ns, cupti_minus_host_ns, err_ns, gpu_minus_host_ns, gpu}  clock points (start, every second, end)
//   name    {id, name}                         a demangled kernel name or an NVTX string, before its first use
//   k       {s, e, dev, ctx, st, n, c, grid, block[, g, gn]}                 a kernel
//   m       {s, e, dev, ctx, st, c, b, kind[, g, gn]}                        a memcpy (kind: CUPTI's copy kind)
//   ms      {s, e, dev, ctx, st, c, b[, g, gn]}                              a memset
//   nvtx    {t, id, f, tid[, n, dm]}          an NVTX marker (f: CUPTI flags; start 2, end 4, instantaneous 1)
//   end     {records, dropped, buffers}        last line after a clean flush at exit
//
// s, e, t are CUPTI timestamps (ns on CUPTI's clock: CLOCK_REALTIME on Linux). The clock libprism's op and
// iteration events use (GPU %globaltimer) is host + gpu_minus_host_ns; CUPTI's is host + cupti_minus_host_ns. So
// gpu(t) = t - cupti_minus_host(t) + gpu_minus_host(t), both interpolated between sync lines (gpu false: the GPU
// offset was not measured yet at that point). g/gn: CUDA graph id and graph node id (kernels of a graph launch).
#pragma once

#include <string>

namespace prism::kernels {

inline constexpr int kFormatVersion = 1;

inline std::string FileName(int rank) { return "rank" + std::to_string(rank) + ".kernels.jsonl"; }

// CUPTI's copy kinds (CUpti_ActivityMemcpyKind) by value, as the file stores them.
inline const char* CopyKindName(int kind) {
  switch (kind) {
    case 1: return "HtoD";
    case 2: return "DtoH";
    case 3: return "HtoA";
    case 4: return "AtoH";
    case 5: return "AtoA";
    case 6: return "AtoD";
    case 7: return "DtoA";
    case 8: return "DtoD";
    case 9: return "HtoH";
    case 10: return "PtoP";
    default: return "?";
  }
}

// NVTX marker flags (CUpti_ActivityFlag) as the file stores them.
inline constexpr int kMarkerInstant = 1;
inline constexpr int kMarkerStart = 2;
inline constexpr int kMarkerEnd = 4;

}  // namespace prism::kernels
