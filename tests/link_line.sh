#!/usr/bin/env bash
# A target's link command, as the build system runs it, names none of the forbidden library files (ctest
# Architecture.PrismRunNoShim: prism-run never links the shim, docs/architecture.md). It must name the required one,
# so that a command read wrong cannot pass.
#   tests/link_line.sh BUILD_DIR GENERATOR MAKE_PROGRAM TARGET TARGET_BINARY_DIR REQUIRED_FILE FORBIDDEN_FILE...
# Why the command and not only the declarations: it also sees a library reached through another one, a link option
# or a plain path.
set -uo pipefail
if [ $# -lt 7 ]; then
  echo "usage: link_line.sh BUILD_DIR GENERATOR MAKE_PROGRAM TARGET TARGET_BINARY_DIR REQUIRED FORBIDDEN..." >&2
  exit 2
fi
build=$1 generator=$2 make=$3 target=$4 target_dir=$5 required=$6
shift 6
case "$generator" in
  Ninja) cmd=$("$make" -C "$build" -t commands "$target" | tail -n 1) ;;
  "Unix Makefiles") cmd=$(cat "$target_dir/CMakeFiles/$target.dir/link.txt") ;;
  *) echo "cannot read a link command under the generator '$generator' (Ninja, Unix Makefiles)"; exit 77 ;;
esac
# One argument per line, unquoted, so that a file name matches as the last component of an argument only.
args=$(tr ' ' '\n' <<< "$cmd" | tr -d "\"'")
has() { grep -qE "(^|/)$(sed 's/[.]/\\./g' <<< "$1")\$" <<< "$args"; }
if ! has "$required"; then
  echo "$target's link command names no $required: not read right? $cmd"
  exit 1
fi
bad=0
for f in "$@"; do
  lib=${f#lib}
  lib=${lib%%.*}
  if has "$f" || grep -qxF -- "-l$lib" <<< "$args"; then
    echo "$target links $f (docs/architecture.md: never the shim)"
    bad=1
  fi
done
if [ $bad = 0 ]; then
  echo "$target's link command names none of: $*"
else
  echo "the link command: $cmd"
fi
exit $bad
