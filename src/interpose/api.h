// Shared by the exported entry points only (the *.cc files of this folder, linked into libprism.so).
#pragma once

#include <exception>

// An exported C symbol (exports.map decides the final list).
#define PRISM_API extern "C" __attribute__((visibility("default")))

namespace prism::interpose {

// Runs `f` and converts any C++ exception into `on_throw`: nothing ever crosses the C boundary.
template <typename R, typename F>
R Guarded(R on_throw, F&& f) noexcept {
  try {
    return f();
  } catch (...) {
    return on_throw;
  }
}

}  // namespace prism::interpose
