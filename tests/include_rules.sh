#!/usr/bin/env bash
# The include directions of docs/architecture.md, checked on the tree (ctest Architecture.IncludeRules):
# each folder may include its own headers and those of the folders listed for it, nothing else of the project.
#   tests/include_rules.sh [SOURCE_DIR]
# With --links, the same directions checked on the build's link declarations (ctest Architecture.LinkRules): a
# target of a folder may link only targets of its own folder and of the folders listed for it. LINK_DEPS is the
# file cmake/Architecture.cmake writes (<build>/link_deps.txt).
#   tests/include_rules.sh --links LINK_DEPS
set -uo pipefail
links=""
if [ "${1:-}" = --links ]; then
  links=${2:?usage: include_rules.sh --links LINK_DEPS}
  [ -r "$links" ] || { echo "cannot read $links" >&2; exit 2; }
else
  root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
  cd "$root" || exit 2
fi
# folder -> the project folders its files may include (besides itself). include/prism is "prism".
declare -A allowed=(
  [include/prism]="prism"
  [src/common]="prism"
  [src/replay]="prism common"
  [src/nccl_patch]="prism common"
  [src/calibrate]="prism common replay"
  [src/coordinator]="prism common nccl_patch replay"
  [src/interpose]="prism common nccl_patch replay"
  [src/analysis]="prism common coordinator replay"
  [src/launcher]="prism common coordinator replay analysis"
  [tools/prism-run]="prism common calibrate coordinator launcher analysis replay"
)
bad=0

if [ -n "$links" ]; then
  # "src/replay/chakra" -> "src/replay" (the table's folder holding it); empty when none does.
  table_dir() {
    local d=$1 best="" k
    for k in "${!allowed[@]}"; do
      if [[ "$d" == "$k" || "$d" == "$k"/* ]] && ((${#k} > ${#best})); then best=$k; fi
    done
    echo "$best"
  }
  # What an include of the folder's headers starts with: "src/replay/chakra" -> "replay", "include/prism" -> "prism".
  short() {
    case "$1" in src/*) local r=${1#src/}; echo "${r%%/*}" ;; include/prism*) echo prism ;; *) basename "$1" ;; esac
  }
  n=0
  while read -r target dir deps; do
    [ -n "$target" ] || continue
    n=$((n + 1))
    key=$(table_dir "$dir")
    if [ -z "$key" ]; then
      echo "$target ($dir): its folder has no line in tests/include_rules.sh's table"
      bad=1
      continue
    fi
    own=$(short "$key")
    ok=" $own ${allowed[$key]} "
    for d in $deps; do
      dep=${d%%=*}
      top=$(short "${d#*=}")
      case "$ok" in *" $top "*) continue ;; esac
      echo "$target ($dir) links $dep (${d#*=}): $key may use only ${own} and ${allowed[$key]} (docs/architecture.md)"
      bad=1
    done
  done < "$links"
  [ "$n" -gt 0 ] || { echo "$links lists no target"; exit 1; }
  [ $bad = 0 ] && echo "link rules hold ($n targets)"
  exit $bad
fi

for dir in "${!allowed[@]}"; do
  [ -d "$dir" ] || continue
  own=$(basename "$dir")
  [ "$dir" = include/prism ] && own=prism
  ok=" $own ${allowed[$dir]} "
  while IFS=: read -r file line text; do
    inc=$(sed -E 's/.*#include "([^"]+)".*/\1/' <<< "$text")
    if [[ "$inc" == ../* ]]; then  # a relative path: the folder it lands in under src/ or include/
      inc=$(realpath -m --relative-to="$root/src" "$(dirname "$file")/$inc")
      [[ "$inc" == ../include/* ]] && inc=${inc#../include/}
    fi
    top=${inc%%/*}
    [ "$top" = "$inc" ] && continue  # a file of the same folder ("subcommands.h")
    case "$ok" in *" $top "*) continue ;; esac
    echo "$file:$line: includes \"$inc\": $dir may include only ${own} and ${allowed[$dir]} (docs/architecture.md)"
    bad=1
  done < <(grep -rnE '^\s*#\s*include\s+"' --include='*.h' --include='*.cc' --include='*.cuh' --include='*.cu' "$dir")
done
[ $bad = 0 ] && echo "include rules hold"
exit $bad
