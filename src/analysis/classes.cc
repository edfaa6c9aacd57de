// Which ranks make up the classes of a world (observed_trace.h): whether a set of real ranks covers every class,
// and the observed graph an emulation writes next to its report.
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "analysis/class_key.h"
#include "analysis/observed_trace.h"
#include "prism/events.h"
#include "replay/trace_io.h"

namespace prism::analysis {

namespace fs = std::filesystem;

bool CoversEveryClass(const world::World& world, const std::vector<int>& ranks, size_t* covered, size_t* classes) {
  std::set<ClassKey> all, have;
  for (int r = 0; r < world.size(); ++r) all.insert(KeyOf(world.CoordsOf(r)));
  for (int r : ranks)
    if (r >= 0 && r < world.size()) have.insert(KeyOf(world.CoordsOf(r)));
  if (covered) *covered = have.size();
  if (classes) *classes = all.size();
  return have.size() == all.size();
}

bool CoversEveryClassOrEpStandIn(const world::World& world, const std::vector<int>& ranks, size_t* mirrored) {
  std::set<ClassKey> all;
  std::map<ClassKey, int> have;
  for (int r = 0; r < world.size(); ++r) all.insert(KeyOf(world.CoordsOf(r)));
  for (int r : ranks)
    if (r >= 0 && r < world.size()) have.emplace(KeyOf(world.CoordsOf(r)), r);
  size_t stand_ins = 0;
  bool ok = true;
  for (const ClassKey& k : all) {
    if (have.count(k)) continue;
    if (world.layout().ep > 1 && EpStandIn(k, have) >= 0) {
      ++stand_ins;
    } else {
      ok = false;
    }
  }
  if (mirrored) *mirrored = stand_ins;
  return ok;
}

bool SameClass(const world::World& world, int a, int b) {
  return KeyOf(world.CoordsOf(a)) == KeyOf(world.CoordsOf(b));
}

std::string WriteObservedTrace(const std::string& dir, const world::World& world, const std::vector<int>& real_ranks) {
  size_t covered = 0, classes = 0;
  if (!CoversEveryClass(world, real_ranks, &covered, &classes) && !CoversEveryClassOrEpStandIn(world, real_ranks))
    return "observed.prism not written: the real ranks cover " + std::to_string(covered) + " of " +
           std::to_string(classes) + " classes (one data-parallel replica covers all; docs/collect.md)";
  ObservedTraceOptions o;
  o.ranks = real_ranks;
  std::sort(o.ranks.begin(), o.ranks.end());
  std::string error;
  auto g = BuildObservedTrace(dir, world, o, &error);
  std::string path = (fs::path(dir) / "observed.prism").string();
  if (g && !replay::WriteTrace(g->trace, path, &error)) g.reset();
  if (!g) {
    std::string first = error.substr(0, error.find('\n'));
    if (first.size() > 240) first = first.substr(0, 240) + "...";
    return "observed.prism not written: " + first + " (prism-run graph build " + dir + " says more)";
  }
  std::string iters = g->first_iteration < 0 ? std::string("one unmarked iteration")
                                             : "iterations " + std::to_string(g->first_iteration) + ".." +
                                                   std::to_string(g->last_iteration);
  std::string mirrored;
  if (!g->mirrored_classes.empty())
    mirrored = "; " + std::to_string(g->mirrored_classes.size()) + " expert-parallel class(es) without a real rank "
               "repeat the nodes of a real rank that differs only in ep (EP symmetry assumed; `prism-run collect "
               "--real-routing` records them)";
  return "observed graph " + path + ": " + std::to_string(g->trace.classes.size()) + " classes, " +
         std::to_string(g->nodes) + " nodes, " + iters +
         (g->warnings.empty() ? "" : ", " + std::to_string(g->warnings.size()) + " warning(s)") + mirrored;
}

std::string ClassCoordinates(const world::World& world, int rank) {
  return KeyText(world, KeyOf(world.CoordsOf(rank)));
}

}  // namespace prism::analysis
