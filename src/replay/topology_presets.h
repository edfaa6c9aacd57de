// The topology presets compiled into the library (generated from examples/topologies/*.json at build time).
#pragma once

#include <string_view>
#include <vector>

namespace prism::replay {

struct TopologyPreset {
  std::string_view name;  // file name without ".json"
  std::string_view json;  // the file's text
};

const std::vector<TopologyPreset>& TopologyPresets();

}  // namespace prism::replay
