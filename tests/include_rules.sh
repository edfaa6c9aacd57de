#!/usr/bin/env bash
# The include directions of docs/architecture.md, checked on the tree (ctest Architecture.IncludeRules):
# each folder may include its own headers and those of the folders listed for it, nothing else of the project.
#   tests/include_rules.sh [SOURCE_DIR]
# A folder with a line of its own (src/coordinator/store) is checked apart from the folder above it
# (src/coordinator), and is named by its path below src/ ("coordinator/store"); one without (src/replay/chakra)
# belongs to the nearest folder above it that has one ("replay").
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
# folder -> the project folders its files may include (besides itself), by name: include/prism is "prism", a folder
# of src/ its path below src/.
declare -A allowed=(
  [include/prism]="prism"
  [src/common]="prism"
  [src/model]="prism common"
  [src/replay]="prism common"
  [src/nccl_patch]="prism common"
  [src/calibrate]="prism common replay"
  [src/coordinator/store]="prism common model"
  [src/coordinator/bus]="prism common nccl_patch"
  [src/coordinator/swap]="prism common"
  [src/coordinator/hang]="prism common"
  [src/coordinator/status]="prism common model coordinator/hang"
  [src/coordinator]="prism common model coordinator/store coordinator/bus coordinator/swap coordinator/hang"
  [src/coordinator/release]="prism common replay coordinator"
  [src/interpose]="prism common nccl_patch replay"
  [src/analysis]="prism common model replay"
  [src/launcher]="prism common model replay coordinator coordinator/store coordinator/swap coordinator/hang
                  coordinator/release analysis"
  [tools/prism-run]="prism common model calibrate replay coordinator coordinator/store coordinator/swap
                     coordinator/hang coordinator/status coordinator/release launcher analysis"
)
bad=0

# key_of DIR: the table's folder holding DIR ("src/replay/chakra" -> "src/replay"), in $key; empty when none does.
key_of() {
  local d=$1 k
  key=""
  for k in "${!allowed[@]}"; do
    if [[ "$d" == "$k" || "$d" == "$k"/* ]] && ((${#k} > ${#key})); then key=$k; fi
  done
}
# name_of KEY: how the table names it ("src/coordinator/store" -> "coordinator/store", "include/prism" -> "prism",
# "tools/prism-run" -> "prism-run"), in $name.
name_of() {
  case "$1" in src/*) name=${1#src/} ;; include/prism) name=prism ;; *) name=$(basename "$1") ;; esac
}
# The allowed names of KEY, its own first, space-delimited on both sides, in $ok.
ok_of() {
  name_of "$1"
  ok=" $name $(tr -s ' \n' '  ' <<< "${allowed[$1]}") "
}

if [ -n "$links" ]; then
  n=0
  while read -r target dir deps; do
    [ -n "$target" ] || continue
    n=$((n + 1))
    key_of "$dir"
    if [ -z "$key" ]; then
      echo "$target ($dir): its folder has no line in tests/include_rules.sh's table"
      bad=1
      continue
    fi
    own_key=$key
    ok_of "$own_key"
    for d in $deps; do
      dep=${d%%=*}
      key_of "${d#*=}"
      if [ -n "$key" ]; then name_of "$key"; else name=${d#*=}; fi
      case "$ok" in *" $name "*) continue ;; esac
      echo "$target ($dir) links $dep (${d#*=}): $own_key may use only$(tr -s ' \n' '  ' <<< "$ok")(docs/architecture.md)"
      bad=1
    done
  done < "$links"
  [ "$n" -gt 0 ] || { echo "$links lists no target"; exit 1; }
  [ $bad = 0 ] && echo "link rules hold ($n targets)"
  exit $bad
fi

dirs=()  # the table's folders not inside another of them (grep goes down into the others)
for k in "${!allowed[@]}"; do
  [ -d "$k" ] || continue
  key_of "${k%/*}"
  [ -z "$key" ] && dirs+=("$k")
done
declare -A ok_cache=()
while IFS=: read -r file line text; do
  key_of "${file%/*}"
  [ -n "$key" ] || continue
  own_key=$key
  if [ -z "${ok_cache[$own_key]:-}" ]; then ok_of "$own_key"; ok_cache[$own_key]=$ok; fi
  ok=${ok_cache[$own_key]}
  [[ "$text" =~ \#[[:space:]]*include[[:space:]]+\"([^\"]+)\" ]] || continue
  inc=${BASH_REMATCH[1]}
  if [[ "$inc" == ../* ]]; then  # a relative path: the file it lands on, from the source root
    path=$(realpath -m --relative-to="$root" "$(dirname "$file")/$inc")
  elif [[ "$inc" != */* ]]; then
    continue  # a file of the same folder ("subcommands.h")
  elif [[ "$inc" == prism/* ]]; then
    path=include/$inc
  else
    path=src/$inc
  fi
  key_of "${path%/*}"
  if [ -n "$key" ]; then name_of "$key"; else name=${inc%%/*}; fi
  case "$ok" in *" $name "*) continue ;; esac
  echo "$file:$line: includes \"$inc\": $own_key may include only$(tr -s ' \n' '  ' <<< "$ok")(docs/architecture.md)"
  bad=1
done < <(grep -rnE '^\s*#\s*include\s+"' --include='*.h' --include='*.cc' --include='*.cuh' --include='*.cu' \
           "${dirs[@]}")
[ $bad = 0 ] && echo "include rules hold"
exit $bad
