// What `prism-run calibrate` measured: NCCL collectives and send/receive between the GPUs of one node, timed
// with CUDA events, in a versioned JSON file (docs/calibrate.md, "The measurement file"). Written by the
// measurer (measure.h), read by the fitter (fit.h); the fitter never needs a GPU.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "prism/trace.h"

namespace prism::calibrate {

inline constexpr const char* kMeasurementsFormat = "prism-calibrate-measurements";
inline constexpr int kMeasurementsVersion = 1;

// What one entry measured. Names in the file: the trace's op names ("allreduce", ...) and "sendrecv".
enum class MeasuredOp : uint8_t { kInvalid = 0, kAllReduce, kAllGather, kReduceScatter, kBroadcast, kAllToAll, kSendRecv };

const char* ToString(MeasuredOp op);
MeasuredOp ParseMeasuredOp(const std::string& s);  // kInvalid when unknown
// The trace op of a collective (kInvalid for kSendRecv).
trace::CollOp CollOpOf(MeasuredOp op);

// One (operation, communicator, size) point.
struct Measurement {
  MeasuredOp op = MeasuredOp::kInvalid;
  int nranks = 0;            // GPUs in the communicator (2 for send/receive)
  int src = -1, dst = -1;    // send/receive only: the sending and the receiving GPU (indices into gpus)
  uint64_t bytes = 0;        // nccl-tests' S: all-gather the whole output, reduce-scatter the whole input
  int iterations = 0;        // timed iterations (after warm-up)
  double time_us = 0.0;      // per call: the slowest GPU's elapsed time over the timed iterations / iterations
  // Derived (written for people; recomputed, not trusted, when read): algbw = S / t, busbw = algbw x factor.
  double algbw_GBps = 0.0;
  double busbw_GBps = 0.0;
};

struct MeasurementSet {
  std::string created;       // ISO 8601 UTC
  std::string host;
  std::string gpu_name;      // e.g. "NVIDIA H200"
  int compute_capability = 0;  // 90 = Hopper
  int gpu_count = 0;         // GPUs the measurement used (devices 0 .. gpu_count-1 of the visible ones)
  std::string nccl_version;  // "2.28.9"
  std::string nccl_library;  // the file NCCL was loaded from
  int cuda_driver_version = 0;  // cuDriverGetVersion, e.g. 13000
  std::string dtype = "f32";
  // NCCL variables in effect while measuring (NCCL_NVLS_ENABLE, NCCL_ALGO, NCCL_PROTO, ...); absent = unset.
  std::map<std::string, std::string> nccl_env;
  std::vector<Measurement> results;

  // True unless NCCL_NVLS_ENABLE was "0" while measuring (NCCL's default enables NVLS where the hardware has it).
  bool NvlsAllowed() const;
  std::string Env(const std::string& name) const;  // "" when unset
};

// algbw and busbw (nccl-tests, doc/PERFORMANCE.md) of one measurement; send/receive has factor 1.
void FillBandwidth(Measurement* m);

nlohmann::json MeasurementsToJson(const MeasurementSet& set);
// Strict: a wrong format or version, a missing or ill-typed field, a non-positive time or size, an unknown op or
// an inconsistent entry is an error naming the entry and the field.
bool MeasurementsFromJson(const nlohmann::json& j, MeasurementSet* out, std::string* error);
bool LoadMeasurements(const std::string& path, MeasurementSet* out, std::string* error);
bool WriteMeasurements(const std::string& path, const MeasurementSet& set, std::string* error);

// "2.28.9" from NCCL's version code (22809; 2.8.x and older used 2804-style codes).
std::string NcclVersionString(int code);
// Current time as ISO 8601 UTC ("2026-11-29T20:15:03Z").
std::string UtcNow();

}  // namespace prism::calibrate
