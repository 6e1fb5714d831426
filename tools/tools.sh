#!/usr/bin/env bash
# The real tools the tests run (built from registries at pinned versions), in one cache outside the clone.
#   tools/tools.sh path            the folder that holds every built tool (bin/ inside it)
#   tools/tools.sh build [NAME...] build the named recipes (default: all); a recipe whose stamp matches is skipped
# A recipe is tools/recipes/<name>.sh: it sets VERSION and PROVIDES (the files it puts in bin/, space-separated)
# and defines build(), which writes them into "$OUT"
# (the shared bin folder) using "$WORK" (a scratch folder removed afterwards). The stamp is keyed by the recipe's
# content, so changing a pin (or anything else in the recipe) rebuilds that tool and only that one.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
RECIPES="${PGC_TOOLS_RECIPES:-$here/recipes}"
CACHE="${PGC_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/proxmox-gpu-cluster/tools}"

case "${1:-}" in
  path) echo "$CACHE"; exit 0 ;;
  build) shift ;;
  *) echo "usage: tools/tools.sh path | build [NAME...]" >&2; exit 2 ;;
esac

mkdir -p "$CACHE/bin" "$CACHE/stamps" "$CACHE/go"
# Go's module and build caches live in the tool cache too, so a warm machine rebuilds nothing and the clone stays
# clean. GOFLAGS=-mod=mod lets a recipe's throwaway module resolve its requirements; GOTOOLCHAIN=local never
# downloads another Go.
export GOPATH="$CACHE/go" GOMODCACHE="$CACHE/go/mod" GOCACHE="$CACHE/go/build" GOTOOLCHAIN=local
export GOFLAGS="-mod=mod -trimpath" CGO_ENABLED="${CGO_ENABLED:-0}"

names=("$@")
if [ ${#names[@]} -eq 0 ]; then
  for f in "$RECIPES"/*.sh; do [ -e "$f" ] && names+=("$(basename "$f" .sh)"); done
fi

for name in "${names[@]}"; do
  recipe="$RECIPES/$name.sh"
  [ -f "$recipe" ] || { echo "tools: no recipe $name (tools/recipes/$name.sh)" >&2; exit 2; }
  stamp="$CACHE/stamps/$name@$(sha256sum "$recipe" | cut -c1-16)"
  provides="$( # shellcheck source=/dev/null
    source "$recipe"; echo "${PROVIDES:?tools/recipes/$name.sh sets no PROVIDES}")"
  present=1
  for f in $provides; do [ -x "$CACHE/bin/$f" ] || present=0; done
  if [ -f "$stamp" ] && [ "$present" = 1 ]; then continue; fi
  start=$SECONDS
  echo "tools: building $name" >&2
  WORK="$(mktemp -d)"
  # Each recipe in a subshell: its variables and functions stay its own; a failure fails the whole build.
  log="$CACHE/logs/$name.log"
  mkdir -p "$CACHE/logs"
  # The build's chatter (every module go downloads) goes to a log, shown only when the build fails. The subshell is
  # a statement of its own, not the left side of `||`: there bash ignores set -e inside it, and a recipe's failing
  # command would not stop its build.
  rc=0
  set +e
  ( exec >"$log" 2>&1
    set -euo pipefail; OUT="$CACHE/bin"; export OUT WORK; cd "$WORK"
    # shellcheck source=/dev/null
    source "$recipe"; build
    for f in $provides; do [ -x "$OUT/$f" ] || { echo "tools: $name did not produce bin/$f" >&2; exit 1; }; done
  )
  rc=$?
  set -e
  if [ "$rc" -ne 0 ]; then
    rm -rf "$WORK"; tail -n 40 "$log" >&2; echo "tools: $name failed (whole log: $log)" >&2; exit 1
  fi
  rm -rf "$WORK"
  rm -f "$CACHE/stamps/$name@"*
  echo "$name built in $((SECONDS - start)) s" > "$stamp"
  cat "$stamp" >&2
done
