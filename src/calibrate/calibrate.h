// `prism-run calibrate`: measure the intra-node collectives on this machine's GPUs (measure.h), or read a
// measurement file, fit the topology's intra-node parameters (fit.h), and write the calibrated topology.
// docs/calibrate.md.
#pragma once

#include <ostream>
#include <string>

#include "calibrate/fit.h"
#include "calibrate/measure.h"

namespace prism::calibrate {

struct CalibrateOptions {
  MeasureOptions measure;
  FitOptions fit;
  std::string from;                            // fit this measurement file, measure nothing (no GPU needed)
  std::string out = "calibrated-topology.json";
  std::string measurements_out;                // "" = OUT with ".json" replaced by ".measurements.json"
  bool per_point = true;                       // print every point's error (--quiet: the summary only)
};

// The measurement file written next to the topology when --measurements-out is not given.
std::string DefaultMeasurementsPath(const std::string& out);

// Returns the exit code: 0 ok; 1 nothing could be measured (no driver, no GPU, one GPU, no NCCL, an NCCL error) or
// a file could not be written; 2 bad input (unreadable or malformed measurement file, unknown base topology,
// measurements the base cannot hold). Messages name the file and the field.
int RunCalibrate(const CalibrateOptions& options, std::ostream& out, std::ostream& err);

}  // namespace prism::calibrate
