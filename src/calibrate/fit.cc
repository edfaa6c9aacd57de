#include "calibrate/fit.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>

#include "replay/cost_model.h"

namespace prism::calibrate {
namespace {

using nlohmann::json;
using replay::CommShape;
using replay::CommTuning;
using replay::CostModel;
using replay::CostModelKind;
using replay::CostModelOptions;
using replay::Topology;

// The cost model as the measurement saw NCCL: one node, the NCCL variables that were set, NVLS only if allowed.
class Evaluator {
 public:
  bool Init(const Topology& topology, const MeasurementSet& set, std::string* error) {
    Topology t = topology;
    t.rank_node.clear();  // Why: measured ranks are GPUs of one node; the model's placement is for global ranks
    t.nvls = t.nvls && set.NvlsAllowed();
    dtype_ = trace::ParseDType(set.dtype);
    CostModelOptions o;
    o.nccl_algo = set.Env("NCCL_ALGO");
    o.nccl_proto = set.Env("NCCL_PROTO");
    o.model = CostModelKind::kNccl;
    std::string err;
    if (!nccl_.Init(t, o, &err)) {
      if (error) *error = "cost model: " + err;
      return false;
    }
    o.model = CostModelKind::kAlphaBeta;
    if (!ab_.Init(t, o, &err)) {
      if (error) *error = "cost model: " + err;
      return false;
    }
    for (const Measurement& m : set.results) {
      if (tuning_.count(m.nranks)) continue;
      CommShape s;
      s.nranks = s.local_ranks = m.nranks;
      s.nnodes = 1;
      tuning_[m.nranks] = nccl_.Tune(s);
    }
    return true;
  }

  replay::CommCost Nccl(const Measurement& m) const {
    if (m.op == MeasuredOp::kSendRecv) return nccl_.SendRecv(m.bytes, 0, 1);
    return nccl_.Collective(tuning_.at(m.nranks), CollOpOf(m.op), m.bytes, dtype_);
  }
  double Ab(const Measurement& m) const {
    if (m.op == MeasuredOp::kSendRecv) return ab_.SendRecv(m.bytes, 0, 1).time_us;
    return ab_.Collective(tuning_.at(m.nranks), CollOpOf(m.op), m.bytes, dtype_).time_us;
  }

 private:
  CostModel nccl_, ab_;
  std::map<int, CommTuning> tuning_;
  trace::DType dtype_ = trace::DType::kF32;
};

bool IsNcclCollective(MeasuredOp op) {
  return op == MeasuredOp::kAllReduce || op == MeasuredOp::kAllGather || op == MeasuredOp::kReduceScatter ||
         op == MeasuredOp::kBroadcast;
}

double IntraBw(const Topology& t) { return t.intra_nvlink ? t.nvlink_bw_GBps : t.pci_bw_GBps; }
void SetIntraBw(Topology* t, double bw) {
  if (t->intra_nvlink) {
    t->nvlink_bw_GBps = bw;
  } else {
    t->pci_bw_GBps = bw;
  }
}

// mean(log^2((model_i + offset) / measured_i)); +inf when a modelled time is not positive.
double LogObjective(const std::vector<double>& model, const std::vector<double>& measured, double offset) {
  double sum = 0;
  for (size_t i = 0; i < model.size(); ++i) {
    double v = model[i] + offset;
    if (v <= 0) return std::numeric_limits<double>::infinity();
    double l = std::log(v / measured[i]);
    sum += l * l;
  }
  return model.empty() ? 0.0 : sum / static_cast<double>(model.size());
}

// The offset that minimises LogObjective: a scan, then golden-section search in the best bracket.
double BestOffset(const std::vector<double>& model, const std::vector<double>& measured, double* objective) {
  double min_model = *std::min_element(model.begin(), model.end());
  double max_meas = *std::max_element(measured.begin(), measured.end());
  double lo = -0.95 * min_model, hi = std::max(max_meas, 1.0);
  constexpr int kScan = 400;
  int best_i = 0;
  double best = std::numeric_limits<double>::infinity();
  for (int i = 0; i <= kScan; ++i) {
    double o = lo + (hi - lo) * i / kScan;
    double f = LogObjective(model, measured, o);
    if (f < best) {
      best = f;
      best_i = i;
    }
  }
  double a = lo + (hi - lo) * std::max(best_i - 1, 0) / kScan;
  double b = lo + (hi - lo) * std::min(best_i + 1, kScan) / kScan;
  const double g = (std::sqrt(5.0) - 1) / 2;
  double c = b - g * (b - a), d = a + g * (b - a);
  double fc = LogObjective(model, measured, c), fd = LogObjective(model, measured, d);
  for (int it = 0; it < 80 && b - a > 1e-6; ++it) {
    if (fc < fd) {
      b = d;
      d = c;
      fd = fc;
      c = b - g * (b - a);
      fc = LogObjective(model, measured, c);
    } else {
      a = c;
      c = d;
      fc = fd;
      d = a + g * (b - a);
      fd = LogObjective(model, measured, d);
    }
  }
  double o = (a + b) / 2;
  double fo = LogObjective(model, measured, o);
  double o_scan = lo + (hi - lo) * best_i / kScan;
  if (best < fo) {
    o = o_scan;
    fo = best;
  }
  *objective = fo;
  return o;
}

// Weighted least squares on relative error: t_i ~ c1_i * a + c2_i * x, minimising sum(((fit - t_i) / t_i)^2).
// a >= 0 (a latency); false when x is not positive or the system is singular (fewer than two distinct sizes).
struct LinearPoint {
  double c1, c2, t;
};
bool FitLinear(const std::vector<LinearPoint>& pts, double* a, double* x) {
  double s11 = 0, s12 = 0, s22 = 0, b1 = 0, b2 = 0;
  for (const LinearPoint& p : pts) {
    double w = 1.0 / (p.t * p.t);
    s11 += w * p.c1 * p.c1;
    s12 += w * p.c1 * p.c2;
    s22 += w * p.c2 * p.c2;
    b1 += w * p.c1 * p.t;
    b2 += w * p.c2 * p.t;
  }
  double det = s11 * s22 - s12 * s12;
  if (pts.size() < 2 || !(std::fabs(det) > 1e-12 * s11 * s22)) return false;
  *a = (b1 * s22 - b2 * s12) / det;
  *x = (s11 * b2 - s12 * b1) / det;
  if (*a < 0) {  // a latency cannot be negative: fit the bandwidth alone
    *a = 0;
    *x = b2 / s22;
  }
  return *x > 0 && std::isfinite(*x) && std::isfinite(*a);
}

// Coefficients of the alpha-beta model (docs/cost-model.md): time = c1 x alpha + c2 x S / beta.
void AbCoefficients(const Measurement& m, double* c1, double* c2) {
  const double n = m.nranks;
  switch (m.op) {
    case MeasuredOp::kAllReduce: *c1 = 2 * (n - 1); *c2 = 2 * (n - 1) / n; break;
    case MeasuredOp::kAllGather:
    case MeasuredOp::kReduceScatter:
    case MeasuredOp::kAllToAll: *c1 = n - 1; *c2 = (n - 1) / n; break;
    case MeasuredOp::kBroadcast: *c1 = n - 1; *c2 = 1; break;
    default: *c1 = 1; *c2 = 1; break;  // send/receive
  }
}

// Why divide by the inverse: 892089 * 0.1 prints as 89208.90000000001, 892089 / 10 as 89208.9.
double Round(double v, double step) {
  const double inv = std::round(1.0 / step);
  return std::round(v * inv) / inv;
}

std::string Fmt(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// The NCCL model's time for every NCCL collective point, with the offset set to zero.
bool NcclTimes(const Topology& t, const MeasurementSet& set, const std::vector<const Measurement*>& pts,
               std::vector<double>* out, std::string* error) {
  Evaluator ev;
  if (!ev.Init(t, set, error)) return false;
  out->clear();
  for (const Measurement* m : pts) out->push_back(ev.Nccl(*m).time_us);
  return true;
}

struct NcclFit {
  double bw = 0, offset = 0, objective = 0;
};

// Joint search: the intra-node bandwidth on a geometric grid (the model is piecewise constant in it: channels x
// speed), for each distinct model the best offset; among equally good bandwidths the one closest to the base.
bool FitNccl(const Topology& base, const MeasurementSet& set, const std::vector<const Measurement*>& pts,
             NcclFit* fit, std::string* error) {
  std::vector<double> measured;
  for (const Measurement* m : pts) measured.push_back(m->time_us);
  const double b0 = IntraBw(base);
  std::vector<double> cands;
  const double step = std::log(1.0025);
  for (int k = static_cast<int>(std::floor(std::log(1.0 / 20) / step)); k <= static_cast<int>(std::log(4.0) / step); ++k) {
    cands.push_back(b0 * std::exp(k * step));
  }
  cands.push_back(b0);
  std::sort(cands.begin(), cands.end());
  Topology t = base;
  t.nccl_intra_latency_offset_us = 0;
  std::vector<double> model, prev;
  double prev_obj = 0, prev_off = 0;
  struct Cand {
    double bw, obj, off;
    std::vector<double> model;
  };
  std::vector<Cand> results;
  for (double bw : cands) {
    SetIntraBw(&t, bw);
    if (!NcclTimes(t, set, pts, &model, error)) return false;
    double obj, off;
    if (!prev.empty() && model == prev) {
      obj = prev_obj;
      off = prev_off;
    } else {
      off = BestOffset(model, measured, &obj);
    }
    results.push_back({bw, obj, off, model});
    prev = model;
    prev_obj = obj;
    prev_off = off;
  }
  double best_obj = std::numeric_limits<double>::infinity();
  for (const Cand& c : results) best_obj = std::min(best_obj, c.obj);
  const Cand* pick = nullptr;
  for (const Cand& c : results) {
    if (c.obj > best_obj * (1 + 1e-9) + 1e-15) continue;
    if (!pick || std::fabs(std::log(c.bw / b0)) < std::fabs(std::log(pick->bw / b0))) pick = &c;
  }
  if (!pick || !std::isfinite(pick->obj)) {
    if (error) *error = "the NCCL model could not be fitted (no bandwidth gives a finite error)";
    return false;
  }
  fit->bw = pick->bw;
  fit->offset = pick->off;
  fit->objective = pick->obj;
  // A round bandwidth when it gives the same model (the base's own value stays as it is).
  for (double r : {1.0, 0.1}) {
    if (pick->bw == b0) break;
    SetIntraBw(&t, Round(pick->bw, r));
    if (NcclTimes(t, set, pts, &model, error) && model == pick->model) {
      fit->bw = Round(pick->bw, r);
      break;
    }
  }
  fit->offset = Round(fit->offset, 0.01);
  return true;
}

// Groups the points a model gets wrong by more than `pct` after calibration: "allreduce n=2: 3 of 14 sizes ...".
std::vector<std::string> PoorFitNotes(const std::vector<PointFit>& pts, double pct, bool nccl_model) {
  struct Group {
    int total = 0, bad = 0;
    uint64_t lo = 0, hi = 0;
    double worst = 0;
    uint64_t worst_bytes = 0;
  };
  std::map<std::pair<int, int>, Group> groups;
  for (const PointFit& p : pts) {
    Group& g = groups[{static_cast<int>(p.m.op), p.m.nranks}];
    ++g.total;
    double e = ErrPct(nccl_model ? p.nccl_after_us : p.ab_after_us, p.m.time_us);
    if (std::fabs(e) <= pct) continue;
    if (g.bad++ == 0) g.lo = g.hi = p.m.bytes;
    g.lo = std::min(g.lo, p.m.bytes);
    g.hi = std::max(g.hi, p.m.bytes);
    if (std::fabs(e) > std::fabs(g.worst)) {
      g.worst = e;
      g.worst_bytes = p.m.bytes;
    }
  }
  std::vector<std::string> out;
  for (const auto& [key, g] : groups) {
    if (g.bad == 0) continue;
    out.push_back(std::string(ToString(static_cast<MeasuredOp>(key.first))) + " n=" + std::to_string(key.second) +
                  ": " + std::to_string(g.bad) + " of " + std::to_string(g.total) + " sizes off by more than " +
                  Fmt("%.0f", pct) + "% (" + FormatBytes(g.lo) + " .. " + FormatBytes(g.hi) + "; worst " +
                  Fmt("%+.0f", g.worst) + "% at " + FormatBytes(g.worst_bytes) + ")");
  }
  return out;
}

json LinkJson(const replay::LinkParams& l) { return {{"latency_us", l.latency_us}, {"bandwidth_GBps", l.bandwidth_GBps}}; }

json StatsJson(const ErrorStats& s) {
  return {{"points", s.points}, {"rms_pct", Round(s.rms_pct, 0.01)}, {"max_abs_pct", Round(s.max_abs_pct, 0.01)}};
}

}  // namespace

std::string FormatBytes(uint64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  double v = static_cast<double>(b);
  while (u < 4 && v >= 1024 && std::fmod(v, 1024) == 0) {
    v /= 1024;
    ++u;
  }
  if (u == 0 && b >= 1024) return Fmt("%.1f KiB", static_cast<double>(b) / 1024);
  return Fmt("%.0f", v) + " " + units[u];
}

std::string BasePresetFor(const std::string& gpu_name, int cc) {
  std::string n = Lower(gpu_name);
  if (n.find("h200") != std::string::npos) return "h200-8x400g";
  if (n.find("h100") != std::string::npos || n.find("h800") != std::string::npos) return "h100-8x400g";
  if (n.find("a100") != std::string::npos || n.find("a800") != std::string::npos) return "a100-8x200g";
  if (cc == 90) return "h100-8x400g";
  if (cc == 80) return "a100-8x200g";
  return "";
}

ErrorStats Stats(const std::vector<PointFit>& points, Column column, MeasuredOp op) {
  ErrorStats s;
  double sum2 = 0;
  for (const PointFit& p : points) {
    if (op != MeasuredOp::kInvalid && p.m.op != op) continue;
    double model = column == Column::kNcclBefore  ? p.nccl_before_us
                   : column == Column::kNcclAfter ? p.nccl_after_us
                   : column == Column::kAbBefore  ? p.ab_before_us
                                                  : p.ab_after_us;
    double e = ErrPct(model, p.m.time_us);
    ++s.points;
    sum2 += e * e;
    if (std::fabs(e) >= s.max_abs_pct) {
      s.max_abs_pct = std::fabs(e);
      s.worst_pct = e;
    }
  }
  if (s.points > 0) s.rms_pct = std::sqrt(sum2 / s.points);
  return s;
}

namespace {

// Fit's steps, in its order. A step that returns false has set *error (when error is not null).
class Fitter {
 public:
  Fitter(const MeasurementSet& set, const FitOptions& options, std::string* error)
      : set_(set), options_(options), error_(error) {}

  bool ChooseBase();
  void StartFromBase();
  void SplitMeasurements();
  bool FitNcclModel();
  void FitSendRecv();
  void FitAlphaBeta();
  bool CompareBeforeAfter();
  void AddNotes();
  void NameCalibrated();
  void AddMetadata();
  FitResult TakeResult() {
    r_.calibrated = std::move(cal_);
    return std::move(r_);
  }

 private:
  const MeasurementSet& set_;
  const FitOptions& options_;
  std::string* error_;
  FitResult r_;
  int max_n_ = 0;  // the most GPUs of one measurement
  Topology base_;  // r_.base without its calibration
  Topology cal_;   // the calibrated topology, from base_
  std::vector<const Measurement*> coll_, p2p_;
};

bool Fitter::ChooseBase() {
  r_.base_spec = options_.base.empty() ? BasePresetFor(set_.gpu_name, set_.compute_capability) : options_.base;
  if (r_.base_spec.empty()) {
    if (error_) {
      *error_ = "no preset topology for GPU \"" + set_.gpu_name + "\" (compute capability " +
                std::to_string(set_.compute_capability) + "): pass --base PRESET|FILE";
    }
    return false;
  }
  std::string err;
  if (!replay::LoadTopology(r_.base_spec, &r_.base, &err)) {
    if (error_) *error_ = "--base: " + err;
    return false;
  }
  if (set_.results.empty()) {
    if (error_) *error_ = "no measurements";
    return false;
  }
  for (const Measurement& m : set_.results) max_n_ = std::max(max_n_, m.nranks);
  if (r_.base.gpus_per_node < std::max(max_n_, 2)) {
    if (error_) {
      *error_ = "base topology " + r_.base.name + " has " + std::to_string(r_.base.gpus_per_node) +
                " GPU(s) per node, but the measurements put " + std::to_string(max_n_) +
                " GPUs on one node: pick a base with at least that many (--base)";
    }
    return false;
  }
  return true;
}

void Fitter::StartFromBase() {
  base_ = r_.base;
  base_.calibration = json();
  cal_ = base_;
  r_.intra_bw_key = base_.intra_nvlink ? "node.nvlink" : "node.pci_GBps";
  r_.intra_bw_before = r_.intra_bw_after = IntraBw(base_);
  r_.offset_before_us = r_.offset_after_us = base_.nccl_intra_latency_offset_us;
}

void Fitter::SplitMeasurements() {
  for (const Measurement& m : set_.results) {
    if (IsNcclCollective(m.op)) coll_.push_back(&m);
    if (m.op == MeasuredOp::kSendRecv) p2p_.push_back(&m);
  }
}

// NCCL model.
bool Fitter::FitNcclModel() {
  if (!coll_.empty()) {
    NcclFit nf;
    if (!FitNccl(base_, set_, coll_, &nf, error_)) return false;
    SetIntraBw(&cal_, nf.bw);
    cal_.nccl_intra_latency_offset_us = nf.offset;
    r_.intra_bw_after = nf.bw;
    r_.offset_after_us = nf.offset;
    r_.fitted_nccl = true;
  } else {
    r_.notes.push_back("no NCCL collective was measured: the intra-node bandwidth and nccl.intra_latency_offset_us "
                       "keep the base's values");
  }
  return true;
}

// Send/receive: p2p.intra.
void Fitter::FitSendRecv() {
  std::vector<LinearPoint> lp;
  for (const Measurement* m : p2p_) lp.push_back({1.0, static_cast<double>(m->bytes), m->time_us});
  double a, x;
  if (!p2p_.empty() && FitLinear(lp, &a, &x)) {
    cal_.p2p_intra.latency_us = Round(a, 0.01);
    cal_.p2p_intra.bandwidth_GBps = Round(1.0 / (x * 1e3), 0.1);
    r_.fitted_p2p = cal_.p2p_intra.bandwidth_GBps > 0;
    if (!r_.fitted_p2p) cal_.p2p_intra = base_.p2p_intra;
  }
  if (!r_.fitted_p2p) {
    r_.notes.push_back(p2p_.empty() ? "no send/receive was measured: p2p.intra keeps the base's values"
                                    : "send/receive could not be fitted (fewer than two sizes, or time does not grow "
                                      "with size): p2p.intra keeps the base's values");
  }
}

// Alpha-beta: every measurement.
void Fitter::FitAlphaBeta() {
  std::vector<LinearPoint> lp;
  for (const Measurement& m : set_.results) {
    double c1, c2;
    AbCoefficients(m, &c1, &c2);
    lp.push_back({c1, c2 * static_cast<double>(m.bytes), m.time_us});
  }
  double a, x;
  if (FitLinear(lp, &a, &x) && Round(1.0 / (x * 1e3), 0.1) > 0) {
    cal_.ab_intra.latency_us = Round(a, 0.01);
    cal_.ab_intra.bandwidth_GBps = Round(1.0 / (x * 1e3), 0.1);
    r_.fitted_ab = true;
  } else {
    r_.notes.push_back("the alpha-beta model could not be fitted (fewer than two sizes, or time does not grow with "
                       "size): alpha_beta.intra keeps the base's values");
  }
}

// Before / after, both under the measurement's conditions.
bool Fitter::CompareBeforeAfter() {
  Evaluator before, after;
  if (!before.Init(base_, set_, error_) || !after.Init(cal_, set_, error_)) return false;
  for (const Measurement& m : set_.results) {
    PointFit p;
    p.m = m;
    p.nccl_before_us = before.Nccl(m).time_us;
    replay::CommCost c = after.Nccl(m);
    p.nccl_after_us = c.time_us;
    p.choice_after = c.Label();
    p.ab_before_us = before.Ab(m);
    p.ab_after_us = after.Ab(m);
    r_.points.push_back(std::move(p));
  }
  return true;
}

// Notes: what the file cannot say, and what the model gets wrong.
void Fitter::AddNotes() {
  const bool nvls_measured = set_.NvlsAllowed();
  if (!nvls_measured && base_.nvls) {
    if (options_.keep_nvls) {
      r_.notes.push_back("NVLS was off while measuring (NCCL_NVLS_ENABLE=0): the model was compared without NVLS; "
                         "--keep-nvls keeps nccl.nvls true, so one-node all-reduce may choose NVLS, which was never "
                         "measured");
    } else {
      cal_.nvls = false;
      r_.notes.push_back("NVLS was off while measuring (NCCL_NVLS_ENABLE=0): the calibrated topology has nccl.nvls "
                         "false, like the NCCL that was measured (--keep-nvls keeps the base's true)");
    }
  }
  if (max_n_ < cal_.gpus_per_node) {
    r_.notes.push_back("fitted on communicators of at most " + std::to_string(max_n_) + " GPUs; the topology has " +
                       std::to_string(cal_.gpus_per_node) + " GPUs per node: larger one-node communicators use the " +
                       "fitted values without having been measured");
  }
  r_.notes.push_back("inter-node keys (network.*, p2p.inter, alpha_beta.inter) are the base's: calibrate measures "
                     "inside one node");
  if (!set_.Env("NCCL_ALGO").empty() || !set_.Env("NCCL_PROTO").empty()) {
    r_.notes.push_back("measured with NCCL_ALGO=\"" + set_.Env("NCCL_ALGO") + "\" NCCL_PROTO=\"" +
                       set_.Env("NCCL_PROTO") + "\": the model was compared under the same restriction; the topology "
                       "cannot carry it (set the same variables when simulating)");
  }
  if (set_.nccl_version != "2.28.9") {
    r_.notes.push_back("measured NCCL " + set_.nccl_version + "; the model's tables are NCCL 2.28.9's");
  }
  if (set_.compute_capability != base_.compute_capability) {
    r_.notes.push_back("the measured GPU has compute capability " + std::to_string(set_.compute_capability) +
                       " but the base topology " + std::to_string(base_.compute_capability) +
                       " (kept: NCCL's tables follow the base)");
  }
  for (std::string& s : PoorFitNotes(r_.points, options_.poor_fit_pct, true)) {
    r_.notes.push_back("not fitted well by the NCCL model: " + s);
  }
  {
    int bad = 0;
    for (const PointFit& p : r_.points) bad += std::fabs(ErrPct(p.ab_after_us, p.m.time_us)) > options_.poor_fit_pct;
    if (bad > 0) {
      r_.notes.push_back("alpha-beta model: " + std::to_string(bad) + " of " + std::to_string(r_.points.size()) +
                         " points off by more than " + Fmt("%.0f", options_.poor_fit_pct) +
                         "% after calibration (one latency and one bandwidth for every op and size)");
    }
  }
}

void Fitter::NameCalibrated() {
  cal_.name = options_.name.empty() ? base_.name + "-calibrated" : options_.name;
  if (!set_.gpu_name.empty()) cal_.gpu = set_.gpu_name;
  cal_.description = "Calibrated by prism-run calibrate from " + std::to_string(set_.gpu_count) + " x " +
                     set_.gpu_name + " (NCCL " + set_.nccl_version + ", measured " + set_.created +
                     ") on base topology " + base_.name + "; intra-node keys fitted, inter-node keys from the base";
}

// Metadata.
void Fitter::AddMetadata() {
  json env = json::object();
  for (const auto& [k, v] : set_.nccl_env) env[k] = v;
  json c = {{"tool", "prism-run calibrate"}, {"created", UtcNow()}, {"measured", set_.created},
            {"measurements_file", options_.measurements_file}, {"host", set_.host}, {"gpu", set_.gpu_name},
            {"gpu_count", set_.gpu_count}, {"compute_capability", set_.compute_capability},
            {"nccl_version", set_.nccl_version}, {"nccl_library", set_.nccl_library},
            {"cuda_driver_version", set_.cuda_driver_version}, {"nccl_env", env}, {"base_topology", r_.base_spec},
            {"measurements", set_.results.size()}};
  if (!options_.prism_version.empty()) c["prism_version"] = options_.prism_version;
  json fitted = json::object();
  if (r_.fitted_nccl) {
    fitted[base_.intra_nvlink ? "node.nvlink_GBps" : "node.pci_GBps"] = {{"before", r_.intra_bw_before},
                                                                          {"after", r_.intra_bw_after}};
    fitted["nccl.intra_latency_offset_us"] = {{"before", r_.offset_before_us}, {"after", r_.offset_after_us}};
  }
  if (r_.fitted_p2p)
    fitted["p2p.intra"] = {{"before", LinkJson(base_.p2p_intra)}, {"after", LinkJson(cal_.p2p_intra)}};
  if (r_.fitted_ab)
    fitted["alpha_beta.intra"] = {{"before", LinkJson(base_.ab_intra)}, {"after", LinkJson(cal_.ab_intra)}};
  if (cal_.nvls != base_.nvls) fitted["nccl.nvls"] = {{"before", base_.nvls}, {"after", cal_.nvls}};
  c["fitted"] = fitted;
  json err_j = json::object();
  err_j["definition"] = "relative error of the modelled time, (model - measured) / measured, in percent";
  for (MeasuredOp op : {MeasuredOp::kInvalid, MeasuredOp::kAllReduce, MeasuredOp::kAllGather,
                        MeasuredOp::kReduceScatter, MeasuredOp::kBroadcast, MeasuredOp::kAllToAll,
                        MeasuredOp::kSendRecv}) {
    ErrorStats nb = Stats(r_.points, Column::kNcclBefore, op);
    if (nb.points == 0) continue;
    err_j[op == MeasuredOp::kInvalid ? "all" : ToString(op)] = {
        {"nccl_before", StatsJson(nb)},
        {"nccl_after", StatsJson(Stats(r_.points, Column::kNcclAfter, op))},
        {"alpha_beta_before", StatsJson(Stats(r_.points, Column::kAbBefore, op))},
        {"alpha_beta_after", StatsJson(Stats(r_.points, Column::kAbAfter, op))}};
  }
  c["error"] = err_j;
  json poor = json::array();
  for (const PointFit& p : r_.points) {
    double e = ErrPct(p.nccl_after_us, p.m.time_us);
    if (std::fabs(e) > options_.poor_fit_pct) {
      poor.push_back({{"op", ToString(p.m.op)}, {"nranks", p.m.nranks}, {"bytes", p.m.bytes},
                      {"measured_us", p.m.time_us}, {"model_us", Round(p.nccl_after_us, 0.001)},
                      {"error_pct", Round(e, 0.1)}});
    }
  }
  c["poorly_fitted_threshold_pct"] = options_.poor_fit_pct;
  c["poorly_fitted"] = poor;
  c["notes"] = r_.notes;
  cal_.calibration = c;
  r_.calibration = c;
}
}  // namespace

bool Fit(const MeasurementSet& set, const FitOptions& options, FitResult* result, std::string* error) {
  Fitter f(set, options, error);
  if (!f.ChooseBase()) return false;
  f.StartFromBase();
  f.SplitMeasurements();
  if (!f.FitNcclModel()) return false;
  f.FitSendRecv();
  f.FitAlphaBeta();
  if (!f.CompareBeforeAfter()) return false;
  f.AddNotes();
  f.NameCalibrated();
  f.AddMetadata();
  *result = f.TakeResult();
  return true;
}

void PrintFit(const FitResult& r, std::ostream& out, bool per_point) {
  const Topology& b = r.base;
  const Topology& c = r.calibrated;
  char line[512];
  out << "fitted (intra-node; base " << r.base_spec << "):\n";
  auto row = [&](const std::string& key, const std::string& before, const std::string& after, bool fitted) {
    std::snprintf(line, sizeof line, "  %-32s %-24s -> %s%s\n", key.c_str(), before.c_str(), after.c_str(),
                  fitted ? "" : "  (not fitted: base value)");
    out << line;
  };
  row(b.intra_nvlink ? "node: NVLink per GPU" : "node.pci_GBps", Fmt("%.1f GB/s", r.intra_bw_before),
      Fmt("%.1f GB/s", r.intra_bw_after), r.fitted_nccl);
  row("nccl.intra_latency_offset_us", Fmt("%.2f us", r.offset_before_us), Fmt("%.2f us", r.offset_after_us),
      r.fitted_nccl);
  auto link = [](const replay::LinkParams& l) { return Fmt("%.2f us", l.latency_us) + Fmt(" %.1f GB/s", l.bandwidth_GBps); };
  row("p2p.intra", link(b.p2p_intra), link(c.p2p_intra), r.fitted_p2p);
  row("alpha_beta.intra", link(b.ab_intra), link(c.ab_intra), r.fitted_ab);
  if (b.nvls != c.nvls) row("nccl.nvls", b.nvls ? "true" : "false", c.nvls ? "true" : "false", true);

  if (per_point) {
    out << "\nmodelled time against measured (error = (model - measured) / measured)\n";
    std::snprintf(line, sizeof line, "%-13s %3s %9s %11s %10s | %11s %8s  %-11s | %10s %8s\n", "op", "n", "bytes",
                  "measured us", "busbw GB/s", "nccl before", "after", "choice", "a-b before", "after");
    out << line;
    for (const PointFit& p : r.points) {
      std::string op = ToString(p.m.op);
      if (p.m.op == MeasuredOp::kSendRecv) op += " " + std::to_string(p.m.src) + ">" + std::to_string(p.m.dst);
      std::snprintf(line, sizeof line, "%-13s %3d %9s %11.2f %10.2f | %+10.1f%% %+7.1f%%  %-11s | %+9.1f%% %+7.1f%%\n",
                    op.c_str(), p.m.nranks, FormatBytes(p.m.bytes).c_str(), p.m.time_us, p.m.busbw_GBps,
                    ErrPct(p.nccl_before_us, p.m.time_us), ErrPct(p.nccl_after_us, p.m.time_us),
                    p.choice_after.c_str(), ErrPct(p.ab_before_us, p.m.time_us), ErrPct(p.ab_after_us, p.m.time_us));
      out << line;
    }
  }
  out << "\nerror summary, % (rms / max |error|)\n";
  std::snprintf(line, sizeof line, "%-14s %6s  %-15s %-15s %-15s %-15s\n", "op", "points", "nccl before",
                "nccl after", "a-b before", "a-b after");
  out << line;
  for (MeasuredOp op : {MeasuredOp::kAllReduce, MeasuredOp::kAllGather, MeasuredOp::kReduceScatter,
                        MeasuredOp::kBroadcast, MeasuredOp::kAllToAll, MeasuredOp::kSendRecv, MeasuredOp::kInvalid}) {
    ErrorStats s[4] = {Stats(r.points, Column::kNcclBefore, op), Stats(r.points, Column::kNcclAfter, op),
                       Stats(r.points, Column::kAbBefore, op), Stats(r.points, Column::kAbAfter, op)};
    if (s[0].points == 0) continue;
    std::string cells[4];
    for (int i = 0; i < 4; ++i) cells[i] = Fmt("%.1f", s[i].rms_pct) + " / " + Fmt("%.1f", s[i].max_abs_pct);
    std::snprintf(line, sizeof line, "%-14s %6d  %-15s %-15s %-15s %-15s\n",
                  op == MeasuredOp::kInvalid ? "all" : ToString(op), s[0].points, cells[0].c_str(), cells[1].c_str(),
                  cells[2].c_str(), cells[3].c_str());
    out << line;
  }
  if (!r.notes.empty()) {
    out << "\nnotes:\n";
    for (const std::string& n : r.notes) out << "  - " << n << "\n";
  }
}

bool WriteTopologyFile(const std::string& path, const Topology& topology, std::string* error) {
  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    if (!f) {
      if (error) *error = path + ": cannot write";
      return false;
    }
    f << replay::TopologyToJson(topology).dump(2) << "\n";
    if (!f.good()) {
      if (error) *error = path + ": write failed";
      return false;
    }
  }
  Topology check;
  std::string err;
  if (!replay::LoadTopology(path, &check, &err)) {
    if (error) *error = path + ": written but does not load back: " + err;
    return false;
  }
  return true;
}

}  // namespace prism::calibrate
