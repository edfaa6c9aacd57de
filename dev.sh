#!/usr/bin/env bash
# One entry point for a fresh machine: installs Debian packages, configures, builds, then
#   ./dev.sh demo   simulate the example graph (no GPU needed)
#   ./dev.sh test   run the unit tests (what CI runs)
#   ./dev.sh build  build only
# BUILD_DIR (default build) and JOBS (default nproc) may be set.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"
cmd="${1:-demo}"
build="${BUILD_DIR:-build}"
jobs="${JOBS:-$(nproc)}"

"$here/scripts/setup.sh"
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
cmake --build "$build" -j "$jobs" 2>&1 | grep -vE '^\[ *[0-9]+%\]|^-- ' || true
[ "${PIPESTATUS[0]}" = 0 ] || { echo "build failed" >&2; exit 1; }

case "$cmd" in
  build) ;;
  demo)
    shift || true
    exec "$build/bin/prism-run" simulate examples/graphs/gpt-tp2-pp2-dp2.prism.json --out "$build/demo-out" "$@" ;;
  test)
    cd "$build" && exec ctest --output-on-failure -j "$jobs" ;;
  *) echo "usage: ./dev.sh demo|test|build" >&2; exit 2 ;;
esac
