#!/usr/bin/env bash
# The include directions of docs/architecture.md, checked on the tree (ctest Architecture.IncludeRules):
# each folder may include its own headers and those of the folders listed for it, nothing else of the project.
#   tests/include_rules.sh [SOURCE_DIR]
set -uo pipefail
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$root" || exit 2
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
