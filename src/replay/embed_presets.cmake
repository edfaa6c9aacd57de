# cmake -DOUT=file.cc -DFILES=a.json|b.json -P embed_presets.cmake
# Writes the table that topology.cc's PresetJson() reads: {name (file name without .json), JSON text}.
string(REPLACE "|" ";" files "${FILES}")
set(body "")
foreach(f ${files})
  get_filename_component(name ${f} NAME)
  string(REGEX REPLACE "\\.json$" "" name "${name}")
  file(READ ${f} text)
  string(APPEND body "    {\"${name}\", R\"prism_preset(${text})prism_preset\"},\n")
endforeach()
file(WRITE ${OUT} "// Generated from examples/topologies/*.json by src/replay/embed_presets.cmake; do not edit.\n"
  "#include \"replay/topology_presets.h\"\n\n"
  "namespace prism::replay {\n\n"
  "const std::vector<TopologyPreset>& TopologyPresets() {\n"
  "  static const std::vector<TopologyPreset> kPresets = {\n${body}  };\n"
  "  return kPresets;\n}\n\n}  // namespace prism::replay\n")
