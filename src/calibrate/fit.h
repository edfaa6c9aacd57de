// Fits the intra-node parameters of a topology to measured NCCL collectives (docs/calibrate.md, "The fit"):
//  - NCCL model: the GPU's intra-node link bandwidth (node.nvlink_link_GBps x links, or node.pci_GBps), which the
//    emulated channel search turns into channels x speed, and nccl.intra_latency_offset_us, a per-call term added to
//    every one-node collective. Joint search minimising the RMS of log(model / measured) over every collective.
//  - p2p.intra {latency_us, bandwidth_GBps} from send/receive: least squares on relative error.
//  - alpha_beta.intra {latency_us, bandwidth_GBps} from every measurement with the alpha-beta formulas.
// Needs no GPU; everything is computed with the same cost model the replay uses (replay/cost_model.h).
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "calibrate/measurements.h"
#include "replay/topology.h"

namespace prism::calibrate {

struct FitOptions {
  std::string base;               // preset name or topology file; "" = the preset for the measured GPU
  std::string measurements_file;  // recorded in the topology's metadata
  std::string name;               // output topology name; "" = "<base name>-calibrated"
  bool keep_nvls = false;         // keep the base's nccl.nvls even when NVLS was off while measuring
  double poor_fit_pct = 25.0;     // |relative error| after calibration above which a point is reported
  std::string prism_version;      // recorded in the metadata
};

// One measurement and what each model says of it, before (base topology) and after calibration.
struct PointFit {
  Measurement m;
  double nccl_before_us = 0, nccl_after_us = 0;  // the NCCL model (p2p links for all-to-all and send/receive)
  double ab_before_us = 0, ab_after_us = 0;      // the alpha-beta model
  std::string choice_after;                      // the NCCL model's algorithm/protocol after calibration
};

struct ErrorStats {
  int points = 0;
  double rms_pct = 0;      // sqrt(mean(err^2)), err = (model - measured) / measured in %
  double max_abs_pct = 0;
  double worst_pct = 0;    // signed error of the worst point
};

struct FitResult {
  std::string base_spec;           // what --base resolved to
  replay::Topology base;
  replay::Topology calibrated;
  std::string intra_bw_key;        // "node.nvlink" (links x per-link GB/s) or "node.pci_GBps"
  double intra_bw_before = 0, intra_bw_after = 0;
  double offset_before_us = 0, offset_after_us = 0;
  bool fitted_nccl = false, fitted_p2p = false, fitted_ab = false;
  std::vector<PointFit> points;
  std::vector<std::string> notes;  // what was not fitted, not measured, or fitted badly
  nlohmann::json calibration;      // the metadata written into the topology ("calibration" key)
};

// Preset for a measured GPU ("NVIDIA H200" -> "h200-8x400g"); "" when none fits.
std::string BasePresetFor(const std::string& gpu_name, int compute_capability);

// Relative error in percent.
inline double ErrPct(double model_us, double measured_us) { return 100.0 * (model_us - measured_us) / measured_us; }

// False + *error when the base cannot be loaded or does not fit the measurements (e.g. fewer GPUs per node
// than were measured). Parameters without measurements keep the base's values (said in notes).
bool Fit(const MeasurementSet& set, const FitOptions& options, FitResult* result, std::string* error);

// Error statistics over the points `select` accepts, for one model column (before/after, nccl/alpha-beta).
enum class Column { kNcclBefore, kNcclAfter, kAbBefore, kAbAfter };
ErrorStats Stats(const std::vector<PointFit>& points, Column column, MeasuredOp op = MeasuredOp::kInvalid);

// The table of fitted parameters, per-point errors, per-op summary and notes.
void PrintFit(const FitResult& result, std::ostream& out, bool per_point = true);

// Writes the calibrated topology (pretty JSON) and reads it back with LoadTopology as a check.
bool WriteTopologyFile(const std::string& path, const replay::Topology& topology, std::string* error);

// "8 B", "2 KiB", "256 MiB".
std::string FormatBytes(uint64_t bytes);

}  // namespace prism::calibrate
