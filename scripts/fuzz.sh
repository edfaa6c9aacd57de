#!/usr/bin/env bash
# Runs libFuzzer targets for a bounded time each, `jobs` at once, and prints one line per target; exit 1 when any
# found a crash, a leak or a timeout (its input is kept under BUILD/fuzz-run/artifacts/TARGET/).
#   scripts/fuzz.sh BUILD_DIR SECONDS JOBS TARGET...      (what `./dev.sh test-fuzz` calls)
# Each target's corpus starts from tests/fuzz/seeds/TARGET.txt: one seed per line, a line's files joined with
# tests/fuzz/fuzz_split.h's separator. The corpus grows in BUILD/fuzz-run/corpus/TARGET/ and is kept between runs.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$1" secs="$2" jobs="$3"
shift 3
work="$build/fuzz-run"
sep=$'\n--next-file--\n'

seed_corpus() {
  local t="$1" corpus="$2" list="$root/tests/fuzz/seeds/$1.txt" n=0 line f out
  [ -f "$list" ] || return 0
  while IFS= read -r line; do
    case "$line" in '' | '#'*) continue ;; esac
    n=$((n + 1))
    out="$corpus/seed-$n"
    : >"$out"
    local first=1
    for f in $line; do
      [ "$first" = 1 ] || printf '%s' "$sep" >>"$out"
      first=0
      cat "$root/$f" >>"$out"
    done
  done <"$list"
}

run_one() {
  local t="$1" corpus="$work/corpus/$1" art="$work/artifacts/$1/" rc=0
  mkdir -p "$corpus" "$art"
  seed_corpus "$t" "$corpus"
  # -timeout: one input running this long is a finding (a hang); -rss_limit_mb: so is a process this large.
  "$build/tests/fuzz/$t" -max_total_time="$secs" -timeout=25 -rss_limit_mb=2560 -print_final_stats=1 \
    -dict="$root/tests/fuzz/split.dict" -artifact_prefix="$art" "$corpus" >"$work/$t.log" 2>&1 || rc=$?
  echo "$rc" >"$work/$t.rc"
}

mkdir -p "$work"
for t in "$@"; do
  [ -x "$build/tests/fuzz/$t" ] || { echo "fuzz: $build/tests/fuzz/$t not built" >&2; exit 1; }
  rm -f "$work/$t.rc"
done
for t in "$@"; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
  run_one "$t" &
done
wait

failed=0
for t in "$@"; do
  rc="$(cat "$work/$t.rc" 2>/dev/null || echo missing)"
  runs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/$t.log" | tail -1)"
  inputs="$(find "$work/corpus/$t" -type f | wc -l)"
  if [ "$rc" = 0 ]; then
    printf 'fuzz: %-20s ok: %s inputs run in %s s, corpus %s\n' "$t" "${runs:-?}" "$secs" "$inputs"
  else
    failed=1
    printf 'fuzz: %-20s FAILED (exit %s): see %s\n' "$t" "$rc" "$work/$t.log"
    grep -E 'ERROR: |SUMMARY: |Test unit written to|^[a-z_]+_fuzz: ' "$work/$t.log" | head -8 | sed 's/^/    /'
    last="$(ls -t "$work/artifacts/$t/" 2>/dev/null | head -1)"
    echo "    reproduce: $build/tests/fuzz/$t $work/artifacts/$t/$last"
  fi
done
exit "$failed"
