#include "calibrate/measurements.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include "common/text.h"
#include "replay/cost_model.h"

namespace prism::calibrate {
namespace {

using nlohmann::json;

constexpr const char* kOpNames[] = {"invalid", "allreduce", "allgather", "reducescatter", "broadcast", "alltoall",
                                    "sendrecv"};
constexpr int kNumOps = sizeof(kOpNames) / sizeof(kOpNames[0]);

struct ParseError {
  std::string what;
};

[[noreturn]] void Fail(const std::string& where, const std::string& what) { throw ParseError{where + ": " + what}; }

const json& Field(const json& obj, const char* key, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end()) Fail(where, std::string("missing \"") + key + "\"");
  return *it;
}

std::string Str(const json& obj, const char* key, const std::string& where, bool required) {
  auto it = obj.find(key);
  if (it == obj.end()) {
    if (required) Fail(where, std::string("missing \"") + key + "\"");
    return "";
  }
  if (!it->is_string()) Fail(where + "." + key, std::string("must be a string, not ") + it->type_name());
  return it->get<std::string>();
}

int64_t Int(const json& obj, const char* key, const std::string& where, int64_t min_value, int64_t max_value) {
  const json& v = Field(obj, key, where);
  if (!v.is_number_integer()) Fail(where + "." + key, std::string("must be an integer, not ") + v.type_name());
  int64_t x = v.get<int64_t>();
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(max_value)) x = max_value + 1;
  if (x < min_value || x > max_value) {
    Fail(where + "." + key, "out of range [" + std::to_string(min_value) + ", " + std::to_string(max_value) +
                                "] (got " + v.dump() + ")");
  }
  return x;
}

double PositiveNum(const json& obj, const char* key, const std::string& where) {
  const json& v = Field(obj, key, where);
  if (!v.is_number()) Fail(where + "." + key, std::string("must be a number, not ") + v.type_name());
  double x = v.get<double>();
  if (!std::isfinite(x) || x <= 0) Fail(where + "." + key, "must be positive (got " + v.dump() + ")");
  return x;
}

void Parse(const json& j, MeasurementSet* s) {
  const std::string w = "measurements";
  if (!j.is_object()) Fail(w, "must be a JSON object");
  std::string format = Str(j, "format", w, true);
  if (format != kMeasurementsFormat) {
    Fail(w + ".format", "expected \"" + std::string(kMeasurementsFormat) + "\" (got \"" + format + "\")");
  }
  int64_t version = Int(j, "version", w, 0, 1 << 20);
  if (version != kMeasurementsVersion) {
    Fail(w + ".version", "this prism reads version " + std::to_string(kMeasurementsVersion) + " (got " +
                             std::to_string(version) + ")");
  }
  s->created = Str(j, "created", w, false);
  s->host = Str(j, "host", w, false);
  const json& gpu = Field(j, "gpu", w);
  if (!gpu.is_object()) Fail(w + ".gpu", "must be an object");
  s->gpu_name = Str(gpu, "name", w + ".gpu", true);
  s->compute_capability = static_cast<int>(Int(gpu, "compute_capability", w + ".gpu", 30, 1000));
  s->gpu_count = static_cast<int>(Int(gpu, "count", w + ".gpu", 2, 1 << 16));
  const json& nccl = Field(j, "nccl", w);
  if (!nccl.is_object()) Fail(w + ".nccl", "must be an object");
  s->nccl_version = Str(nccl, "version", w + ".nccl", true);
  s->nccl_library = Str(nccl, "library", w + ".nccl", false);
  if (auto it = nccl.find("env"); it != nccl.end()) {
    if (!it->is_object()) Fail(w + ".nccl.env", "must be an object of strings");
    for (auto e = it->begin(); e != it->end(); ++e) {
      if (!e->is_string()) Fail(w + ".nccl.env." + e.key(), "must be a string");
      s->nccl_env[e.key()] = e->get<std::string>();
    }
  }
  if (auto it = j.find("cuda_driver_version"); it != j.end()) {
    s->cuda_driver_version = static_cast<int>(Int(j, "cuda_driver_version", w, 0, 1 << 30));
  }
  s->dtype = Str(j, "dtype", w, false);
  if (s->dtype.empty()) s->dtype = "f32";
  if (trace::ParseDType(s->dtype) == trace::DType::kInvalid) Fail(w + ".dtype", "unknown dtype \"" + s->dtype + "\"");

  const json& results = Field(j, "results", w);
  if (!results.is_array()) Fail(w + ".results", "must be an array");
  if (results.empty()) Fail(w + ".results", "is empty: nothing was measured");
  for (size_t i = 0; i < results.size(); ++i) {
    const json& r = results[i];
    std::string wr = w + ".results[" + std::to_string(i) + "]";
    if (!r.is_object()) Fail(wr, "must be an object");
    Measurement m;
    std::string op = Str(r, "op", wr, true);
    m.op = ParseMeasuredOp(op);
    if (m.op == MeasuredOp::kInvalid) {
      Fail(wr + ".op", "unknown op \"" + op +
                           "\" (known: allreduce, allgather, reducescatter, broadcast, alltoall, sendrecv)");
    }
    m.nranks = static_cast<int>(Int(r, "nranks", wr, 2, s->gpu_count));
    if (m.op == MeasuredOp::kSendRecv) {
      if (m.nranks != 2) Fail(wr + ".nranks", "a send/receive is between 2 GPUs (got " + std::to_string(m.nranks) + ")");
      m.src = static_cast<int>(Int(r, "src", wr, 0, s->gpu_count - 1));
      m.dst = static_cast<int>(Int(r, "dst", wr, 0, s->gpu_count - 1));
      if (m.src == m.dst) Fail(wr, "src and dst are the same GPU (" + std::to_string(m.src) + ")");
    }
    m.bytes = static_cast<uint64_t>(Int(r, "bytes", wr, 1, int64_t{1} << 50));
    m.iterations = static_cast<int>(Int(r, "iterations", wr, 1, 1 << 30));
    m.time_us = PositiveNum(r, "time_us", wr);
    FillBandwidth(&m);
    s->results.push_back(m);
  }
}

}  // namespace

const char* ToString(MeasuredOp op) {
  int i = static_cast<int>(op);
  return i >= 0 && i < kNumOps ? kOpNames[i] : kOpNames[0];
}

MeasuredOp ParseMeasuredOp(const std::string& s) {
  for (int i = 1; i < kNumOps; ++i) {
    if (s == kOpNames[i]) return static_cast<MeasuredOp>(i);
  }
  return MeasuredOp::kInvalid;
}

trace::CollOp CollOpOf(MeasuredOp op) {
  switch (op) {
    case MeasuredOp::kAllReduce: return trace::CollOp::kAllReduce;
    case MeasuredOp::kAllGather: return trace::CollOp::kAllGather;
    case MeasuredOp::kReduceScatter: return trace::CollOp::kReduceScatter;
    case MeasuredOp::kBroadcast: return trace::CollOp::kBroadcast;
    case MeasuredOp::kAllToAll: return trace::CollOp::kAllToAll;
    default: return trace::CollOp::kInvalid;
  }
}

bool MeasurementSet::NvlsAllowed() const { return Env("NCCL_NVLS_ENABLE") != "0"; }

std::string MeasurementSet::Env(const std::string& name) const {
  auto it = nccl_env.find(name);
  return it == nccl_env.end() ? "" : it->second;
}

void FillBandwidth(Measurement* m) {
  if (m->time_us <= 0) {
    m->algbw_GBps = m->busbw_GBps = 0;
    return;
  }
  m->algbw_GBps = static_cast<double>(m->bytes) / (m->time_us * 1e3);  // bytes/us = MB/s; / 1e3 = GB/s
  double factor = m->op == MeasuredOp::kSendRecv ? 1.0 : replay::BusBwFactor(CollOpOf(m->op), m->nranks);
  m->busbw_GBps = m->algbw_GBps * factor;
}

nlohmann::json MeasurementsToJson(const MeasurementSet& s) {
  json j;
  j["format"] = kMeasurementsFormat;
  j["version"] = kMeasurementsVersion;
  j["created"] = s.created;
  j["host"] = s.host;
  j["gpu"] = {{"name", s.gpu_name}, {"compute_capability", s.compute_capability}, {"count", s.gpu_count}};
  json env = json::object();
  for (const auto& [k, v] : s.nccl_env) env[k] = v;
  j["nccl"] = {{"version", s.nccl_version}, {"library", s.nccl_library}, {"env", env}};
  j["cuda_driver_version"] = s.cuda_driver_version;
  j["dtype"] = s.dtype;
  j["timing"] = "per call: CUDA events around the timed iterations on every GPU, the slowest GPU / iterations";
  json results = json::array();
  for (const Measurement& m : s.results) {
    Measurement c = m;
    FillBandwidth(&c);
    json r = {{"op", ToString(m.op)}, {"nranks", m.nranks}, {"bytes", m.bytes}, {"iterations", m.iterations},
              {"time_us", m.time_us}, {"algbw_GBps", c.algbw_GBps}, {"busbw_GBps", c.busbw_GBps}};
    if (m.op == MeasuredOp::kSendRecv) {
      r["src"] = m.src;
      r["dst"] = m.dst;
    }
    results.push_back(std::move(r));
  }
  j["results"] = std::move(results);
  return j;
}

bool MeasurementsFromJson(const nlohmann::json& j, MeasurementSet* out, std::string* error) {
  MeasurementSet s;
  try {
    Parse(j, &s);
  } catch (const ParseError& e) {
    if (error) *error = e.what;
    return false;
  } catch (const std::exception& e) {
    if (error) *error = std::string("measurements: ") + e.what();
    return false;
  }
  *out = std::move(s);
  return true;
}

bool LoadMeasurements(const std::string& path, MeasurementSet* out, std::string* error) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (error) *error = path + ": cannot open";
    return false;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  json j = json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    if (error) *error = path + ": not valid JSON";
    return false;
  }
  std::string err;
  if (!MeasurementsFromJson(j, out, &err)) {
    if (error) *error = path + ": " + err;
    return false;
  }
  return true;
}

bool WriteMeasurements(const std::string& path, const MeasurementSet& set, std::string* error) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) {
    if (error) *error = path + ": cannot write";
    return false;
  }
  f << MeasurementsToJson(set).dump(1) << "\n";
  if (!f.good()) {
    if (error) *error = path + ": write failed";
    return false;
  }
  return true;
}

std::string NcclVersionString(int code) {
  if (code <= 0) return "unknown";
  int major, minor, patch;
  if (code >= 10000) {  // NCCL_VERSION(X,Y,Z) = X*10000 + Y*100 + Z since 2.9
    major = code / 10000;
    minor = code / 100 % 100;
    patch = code % 100;
  } else {
    major = code / 1000;
    minor = code / 100 % 10;
    patch = code % 100;
  }
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

std::string UtcNow() { return TimeNow("%Y-%m-%dT%H:%M:%SZ", /*utc=*/true); }

}  // namespace prism::calibrate
