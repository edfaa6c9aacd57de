#include "launcher/fill.h"

#include <algorithm>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace prism::launcher {

size_t ClearUnsampledSetUp(trace::Trace* t, const analysis::FillSamples& samples) {
  bool has_zero = false, has_later = false;
  for (const auto& cls : t->classes)
    for (const auto& st : cls.streams)
      for (const auto& n : st.nodes) (n.iter == 0 ? has_zero : has_later) = true;
  if (!has_zero || !has_later) return 0;  // no iteration marks: no set-up to tell apart
  size_t cleared = 0;
  for (uint32_t c = 0; c < t->classes.size(); ++c) {
    if (samples.Count(c) > 0) continue;
    bool any = false;
    for (auto& st : t->classes[c].streams)
      for (auto& n : st.nodes)
        if (n.kind == trace::NodeKind::kCompute && n.iter == 0 && n.dur_us > 0) {
          n.dur_us = 0;
          any = true;
        }
    cleared += any ? 1 : 0;
  }
  return cleared;
}

std::string LockstepSlots(const std::string& spec, const trace::Trace& t) {
  if (spec == "none") return "";
  if (spec != "auto") return spec;
  std::vector<std::string> out;
  for (const auto& cls : t.classes)
    for (const std::string& name : cls.comm_slots) {
      const std::string base = name.substr(0, name.find('#'));
      // Its '-'-separated dimensions ("tp-dp-cp") are all tp, cp or dp.
      std::istringstream dims(base);
      std::string dim;
      bool stage_local = !base.empty();
      while (stage_local && std::getline(dims, dim, '-')) stage_local = dim == "tp" || dim == "cp" || dim == "dp";
      if (stage_local && base.back() == '-') stage_local = false;
      if (stage_local && std::find(out.begin(), out.end(), base) == out.end()) out.push_back(base);
    }
  std::string joined;
  for (const std::string& s : out) joined += (joined.empty() ? "" : ",") + s;
  return joined;
}

std::vector<std::vector<int>> FillSlices(const std::vector<int>& reps, const world::World& w, int gpus) {
  std::vector<std::vector<int>> out;
  if (gpus <= 1) {
    for (int r : reps) out.push_back({r});
    return out;
  }
  std::map<std::vector<int>, std::vector<int>> by_group;  // coordinates but tp -> ranks, in class order
  std::vector<std::vector<int>> order;
  for (int r : reps) {
    const world::Coords c = w.CoordsOf(r);
    std::vector<int> key = {c.cp, c.dp, c.pp, c.ep, c.edp};
    if (!by_group.count(key)) order.push_back(key);
    by_group[key].push_back(r);
  }
  for (const auto& key : order) {
    const std::vector<int>& g = by_group[key];
    for (size_t i = 0; i < g.size(); i += static_cast<size_t>(gpus)) {
      out.emplace_back(g.begin() + static_cast<std::ptrdiff_t>(i),
                       g.begin() + static_cast<std::ptrdiff_t>(std::min(g.size(), i + static_cast<size_t>(gpus))));
    }
  }
  return out;
}

}  // namespace prism::launcher
