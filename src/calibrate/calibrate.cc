#include "calibrate/calibrate.h"

#include <unistd.h>

#include <filesystem>
#include <system_error>

namespace prism::calibrate {
namespace {

constexpr int kExitOk = 0, kExitFailure = 1, kExitBadInput = 2;

// Creates the folder a file goes into and checks it can be written, before any GPU time is spent.
bool PrepareOutput(const std::string& path, std::string* error) {
  namespace fs = std::filesystem;
  fs::path dir = fs::path(path).parent_path();
  if (dir.empty()) dir = ".";
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || ::access(dir.c_str(), W_OK) != 0) {
    *error = path + ": cannot write into " + dir.string() + (ec ? " (" + ec.message() + ")" : "");
    return false;
  }
  return true;
}

}  // namespace

std::string DefaultMeasurementsPath(const std::string& out) {
  const std::string ext = ".json";
  if (out.size() > ext.size() && out.compare(out.size() - ext.size(), ext.size(), ext) == 0) {
    return out.substr(0, out.size() - ext.size()) + ".measurements.json";
  }
  return out + ".measurements.json";
}

int RunCalibrate(const CalibrateOptions& o, std::ostream& out, std::ostream& err) {
  MeasurementSet set;
  std::string error;
  std::string meas_path = o.from.empty() ? (o.measurements_out.empty() ? DefaultMeasurementsPath(o.out)
                                                                       : o.measurements_out)
                                         : o.from;
  if (!PrepareOutput(o.out, &error) || (o.from.empty() && !PrepareOutput(meas_path, &error))) {
    err << "prism-run calibrate: " << error << "\n";
    return kExitBadInput;
  }
  if (!o.from.empty()) {
    if (!LoadMeasurements(o.from, &set, &error)) {
      err << "prism-run calibrate: " << error << "\n";
      return kExitBadInput;
    }
    out << "calibrate: " << set.results.size() << " measurements from " << o.from << " (" << set.gpu_count << " x "
        << set.gpu_name << ", NCCL " << set.nccl_version << ", measured " << set.created << ")\n";
  } else {
    if (!Measure(o.measure, &set, out, &error)) {
      err << "prism-run calibrate: cannot measure: " << error << "\n";
      return kExitFailure;
    }
    if (!WriteMeasurements(meas_path, set, &error)) {
      err << "prism-run calibrate: " << error << "\n";
      return kExitFailure;
    }
    out << "wrote " << meas_path << " (" << set.results.size() << " measurements)\n";
  }

  FitOptions fo = o.fit;
  fo.measurements_file = meas_path;
  FitResult r;
  if (!Fit(set, fo, &r, &error)) {
    err << "prism-run calibrate: " << error << "\n";
    return kExitBadInput;
  }
  out << "\n";
  PrintFit(r, out, o.per_point);
  if (!WriteTopologyFile(o.out, r.calibrated, &error)) {
    err << "prism-run calibrate: " << error << "\n";
    return kExitFailure;
  }
  out << "\nwrote " << o.out << " (topology \"" << r.calibrated.name << "\"; use it with --topology " << o.out
      << ")\n";
  return kExitOk;
}

}  // namespace prism::calibrate
