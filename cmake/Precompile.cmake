# Precompiled headers: the third-party and standard headers that most files include, parsed once per kind of target
# instead of once per file. Why: nlohmann/json and spdlog with fmt (header-only, Dependencies.cmake) take seconds to
# parse in every file, GoogleTest too in every test (docs/building.md "Build time" has the measured effect).
# Why one header set reused per kind of target: GCC takes a precompiled header only from a compile with the same
# -fPIC/-fPIE, so libraries share one built as a static library, executables (tests, prism-run) one built as an
# executable. libprism (src/interpose) has none: its hidden visibility must apply to what the headers declare.
option(PRISM_PCH "Precompile the headers most files include" ON)

set(PRISM_PCH_HEADERS
    <algorithm> <atomic> <chrono> <cstdint> <cstdio> <cstring> <filesystem> <fstream> <functional> <map> <memory>
    <mutex> <optional> <set> <sstream> <string> <string_view> <thread> <unordered_map> <vector>
    <nlohmann/json.hpp> <spdlog/spdlog.h>)

set(_prism_pch_dir ${CMAKE_CURRENT_LIST_DIR})

# prism_pch_providers(): the targets whose precompiled headers the others reuse (call once, after prism_deps exists).
function(prism_pch_providers)
  if(NOT PRISM_PCH)
    return()
  endif()
  add_library(prism_pch_lib STATIC ${_prism_pch_dir}/pch_stub.cc)
  target_link_libraries(prism_pch_lib PRIVATE prism_deps)
  target_precompile_headers(prism_pch_lib PRIVATE ${PRISM_PCH_HEADERS})
endfunction()

# prism_precompile(<target>): a library reuses the libraries' precompiled headers.
function(prism_precompile target)
  if(PRISM_PCH)
    target_precompile_headers(${target} REUSE_FROM prism_pch_lib)
  endif()
endfunction()
