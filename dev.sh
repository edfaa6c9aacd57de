#!/usr/bin/env bash
# One entry point for a fresh machine: installs Debian packages, configures, builds, then
#   ./dev.sh demo   simulate the example graph (no GPU needed)
#   ./dev.sh test   run the unit tests (what CI runs)
#   ./dev.sh build  build only
#   ./dev.sh test-asan  build-asan (ASan + UBSan) and run the tests of the readers and parsers that face hostile
#                   input (ASAN_TESTS, a ctest -R pattern, overrides the list)
#   ./dev.sh test-fuzz  build-fuzz (clang, libFuzzer + ASan + UBSan) and run every fuzz target of tests/fuzz for
#                   FUZZ_SECONDS (default 30) each, JOBS at once (scripts/fuzz.sh)
# BUILD_DIR (default build) and JOBS (default nproc) may be set.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"
cmd="${1:-demo}"
build="${BUILD_DIR:-build}"
jobs="${JOBS:-$(nproc)}"

# Why the extra packages only for test-fuzz: clang and its runtimes are large, and nothing else needs them.
if [ "$cmd" = test-fuzz ]; then "$here/scripts/setup.sh" fuzz; else "$here/scripts/setup.sh"; fi

# Why a subset under the sanitizers: the whole suite preloads libprism into Python and torch processes (an ASan
# library cannot load into them) and would take longer than CI's time; these tests drive every reader, the store and
# the CLI with hostile bytes.
asan_targets=(prism-run input_limits_test hostile_input_cli_test rank_list_test input_fuzz_test trace_format_test
  store_protocol_test store_server_test chakra_import_test chakra_stream_test report_compare_test synth_test
  observed_trace_test event_bus_test coordinator_exchange_test kernel_report_test topology_test)
asan_tests='^(InputLimits|SynthLimits|HostileInputCli|RankList|InputFuzz|TraceFormat|StoreProtocol|StoreServer(Test|CapTest|Exceptions|Bind|Record)|ChakraTest|ChakraStream|ReportDiff|ReportLoad|ReportShow|RunReport|ReportCli|Synth|ObservedTrace|GraphCli|EventBusCaps|ExchangeHub|KernelFile|Topology)\.'
if [ "$cmd" = test-asan ]; then
  asan=build-asan
  if [ ! -f "$asan/CMakeCache.txt" ]; then
    # Why -O1 -g1: the suite runs in seconds, so the build is the stage's time; -O1 is what ASan recommends and -g1
    # keeps the line tables its reports print (docs/building.md "Build time").
    cmake -S . -B "$asan" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
      -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DPRISM_SANITIZE=address,undefined >/dev/null
  fi
  cmake --build "$asan" -j "$jobs" --target "${asan_targets[@]}" 2>&1 | grep -vE '^\[ *[0-9]+%\]|^-- ' || true
  [ "${PIPESTATUS[0]}" = 0 ] || { echo "asan build failed" >&2; exit 1; }
  cd "$asan"
  # detect_leaks=0: the CLI's subprocess tests exit through paths that keep globals alive on purpose.
  export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=0}" UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}"
  exec ctest --output-on-failure -j "$jobs" -R "${ASAN_TESTS:-$asan_tests}"
fi

# Why clang in a build directory of its own: libFuzzer comes with clang, and the targets compile the readers' sources
# with its coverage instrumentation (tests/fuzz/CMakeLists.txt).
fuzz_targets=(store_request_fuzz ipc_frame_fuzz trace_reader_fuzz event_file_fuzz chakra_import_fuzz)
if [ "$cmd" = test-fuzz ]; then
  fuzz=build-fuzz
  if [ ! -f "$fuzz/CMakeCache.txt" ]; then
    cmake -S . -B "$fuzz" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
      -DPRISM_FUZZ=ON -DBUILD_TESTING=OFF >/dev/null
  fi
  cmake --build "$fuzz" -j "$jobs" --target "${fuzz_targets[@]}" 2>&1 | grep -vE '^\[ *[0-9]+%\]|^-- ' || true
  [ "${PIPESTATUS[0]}" = 0 ] || { echo "fuzz build failed" >&2; exit 1; }
  exec "$here/scripts/fuzz.sh" "$fuzz" "${FUZZ_SECONDS:-30}" "$jobs" "${fuzz_targets[@]}"
fi

if [ ! -f "$build/CMakeCache.txt" ]; then
  # Why -g1: full debug information is a quarter of the compile time and most of the binaries' size; line tables keep
  # backtraces readable (docs/building.md "Build time").
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" >/dev/null
fi
# Why demo builds prism-run alone: simulate needs nothing else, and the tests and benchmarks are most of the build.
targets=()
[ "$cmd" = demo ] && targets=(--target prism-run)
cmake --build "$build" -j "$jobs" "${targets[@]}" 2>&1 | grep -vE '^\[ *[0-9]+%\]|^-- ' || true
[ "${PIPESTATUS[0]}" = 0 ] || { echo "build failed" >&2; exit 1; }

case "$cmd" in
  build) ;;
  demo)
    shift || true
    exec "$build/bin/prism-run" simulate examples/graphs/gpt-tp2-pp2-dp2.prism.json --out "$build/demo-out" "$@" ;;
  test)
    cd "$build" && exec ctest --output-on-failure -j "$jobs" ;;
  *) echo "usage: ./dev.sh demo|test|test-asan|test-fuzz|build" >&2; exit 2 ;;
esac
