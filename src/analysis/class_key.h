// The class of a rank (what the graph builder and its class checks share; not an interface): the coordinates that
// define it, everything but the data-parallel ones, and their names.
#pragma once

#include <algorithm>
#include <array>
#include <map>
#include <string>
#include <utility>

#include "model/world.h"

namespace prism::analysis {

// Class-defining coordinates: everything but the data-parallel ones.
using ClassKey = std::array<int, 7>;  // tp, cp, pp, gtp, etp, ep, egtp

inline ClassKey KeyOf(const world::Coords& c) { return {c.tp, c.cp, c.pp, c.gtp, c.etp, c.ep, c.egtp}; }

inline std::string KeyText(const world::World& w, const ClassKey& k) {
  const world::Layout& l = w.layout();
  const std::array<std::pair<const char*, int>, 7> dims = {{{"tp", l.tp},
                                                            {"cp", l.cp},
                                                            {"pp", l.pp},
                                                            {"gtp", l.gtp},
                                                            {"etp", l.ExpertTp()},
                                                            {"ep", l.ep},
                                                            {"egtp", l.egtp}}};
  std::string s;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i].second <= 1) continue;
    // Why skip etp when it equals tp: with the default orders it is the same coordinate, printed once.
    if (i == 4 && l.ExpertTp() == l.tp && k[4] == k[0]) continue;
    s += (s.empty() ? "" : " ") + std::string(dims[i].first) + "=" + std::to_string(k[i]);
  }
  return s.empty() ? std::string("replica") : s;
}

// The class that stands in for expert-parallel class `k` when it has no events: among `have` (classes with events
// of their own), the one equal to `k` but for ep, the lowest ep first. -1 when there is none.
inline int EpStandIn(const ClassKey& k, const std::map<ClassKey, int>& have) {
  ClassKey probe = k;
  int best_ep = -1, best = -1;
  for (const auto& [key, index] : have) {
    probe[5] = key[5];
    if (key != probe || key[5] == k[5]) continue;
    if (best_ep < 0 || key[5] < best_ep) {
      best_ep = key[5];
      best = index;
    }
  }
  return best;
}

inline std::string ClassName(const world::World& w, const ClassKey& k) {
  std::string s = KeyText(w, k);
  std::replace(s.begin(), s.end(), ' ', '-');
  s.erase(std::remove(s.begin(), s.end(), '='), s.end());
  return s;
}

}  // namespace prism::analysis
