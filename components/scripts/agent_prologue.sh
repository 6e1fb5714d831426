#!/usr/bin/env bash
# The node agent's prologue: the first lines of every step's script as it is installed on a machine
# (see render/agent_bundle.py). The whole step.sh is one brace group: bash reads all of it before it runs any of
# it, so a file cut short (a copy racing this run) is a syntax error, never a step that ends early with exit 0.
#
# 1. Install: pulumi-command's CopyToRemote writes the agent's copy (~/.proxmox-gpu-cluster/agent/<step>-<fp>/)
#    in place, so another copy (another stack on the same node) can rewrite a file while a step reads it. A step
#    therefore runs from the store, ~/.proxmox-gpu-cluster/bundles/<step>-<fp>/, which nothing ever writes into:
#    run from the copy, this prologue copies the bundle into a new directory beside the store's, checks it and
#    renames it into place (a complete one there, also one another run installed a moment ago, is left alone),
#    then runs the store's step.sh. A store bundle that is not what its name says (damaged by hand) is replaced the
#    same way: the damaged directory renamed aside, a checked copy renamed in (a step started in between runs from
#    the copy and installs it again).
# 2. The bundle checks itself: its directory's name ends in the fingerprint of its files (sha256 of the
#    `sha256sum` listing of the files, C locale order).
# 3. Secrets arrive on stdin and only there, one `NAME=<base64>` line each, for the known names only; they become
#    shell variables (never exported, never arguments, never files). A step run from text on stdin (`bash -s`, as
#    the tests still do for some scripts) has no file of its own and skips all three.
set -euo pipefail

# pgc_fingerprint <dir>: the fingerprint of the directory's files (a directory beside them, such as a __pycache__
# an older python3 run left, is no part of the bundle).
pgc_fingerprint() {
  local file files=()
  for file in "$1"/*; do
    [[ -f "$file" ]] && files+=("${file##*/}")
  done
  ((${#files[@]})) || return 0
  (cd "$1" && LC_ALL=C sha256sum -- "${files[@]}" | sha256sum | cut -c1-12)
}

# pgc_install <copy> <final>: the bundle at <final> in the store, complete, from the agent's copy. A copy being
# rewritten by another CopyToRemote does not check: tried again for up to a minute.
pgc_install() {
  local copy="$1" final="$2" name="${2##*/}" new file try
  local want="${name##*-}" step="${name%-*}"
  local said
  said="$(mkdir -p -- "${final%/*}" 2>&1)" || {
    echo "$step: agent: expected the bundle store ${final%/*}, saw $said" >&2
    exit 1
  }
  for ((try = 1; ; try++)); do
    [[ "$(pgc_fingerprint "$final" 2>/dev/null)" != "$want" ]] || return 0
    [[ -d "$copy" ]] || {
      echo "$step: agent: expected the node agent's copy $copy, saw nothing (replace this machine's -agent resource with pulumi up --replace <its URN>)" >&2
      exit 1
    }
    new="$(mktemp -d "${final%/*}/.new-$name.XXXXXX" 2>&1)" || {
      echo "$step: agent: expected a new bundle directory in ${final%/*}, saw $new" >&2
      exit 1
    }
    for file in "$copy"/*; do
      [[ ! -f "$file" ]] || cp -- "$file" "$new/"
    done
    if [[ "$(pgc_fingerprint "$new")" == "$want" ]]; then
      chmod 755 "$new"
      # rename(2) does not replace a directory that holds files: the first of several runs installing at once wins
      # and the others keep its bundle, which its run may be about to exec.
      mv -T -- "$new" "$final" 2>/dev/null && return 0
      if [[ "$(pgc_fingerprint "$final" 2>/dev/null)" == "$want" ]]; then
        rm -rf -- "$new"
        return 0
      fi
      # A damaged bundle (edited by hand) goes aside, where a run reading it keeps its files, then the loop again.
      mv -T -- "$final" "$(mktemp -u "${final%/*}/.old-$name.XXXXXX")" 2>/dev/null || true
      mv -T -- "$new" "$final" 2>/dev/null || rm -rf -- "$new"
      continue
    fi
    rm -rf -- "$new"
    if ((try >= 60)); then
      echo "$step: agent: bundle $copy: expected fingerprint $want, saw $(pgc_fingerprint "$copy") (an incomplete or edited copy: replace this machine's -agent resource with pulumi up --replace <its URN>)" >&2
      exit 1
    fi
    sleep 1
  done
}

if [[ -n "${PGC_AGENT_COPY:-}" && -f "${BASH_SOURCE[0]:-}" ]]; then
  # Run from the launcher's private snapshot of the copy's step.sh (agent_bundle.LAUNCHER): the snapshot was
  # read whole, so it is done with; install the bundle from the copy and run it from the store.
  rm -f -- "${BASH_SOURCE[0]}"
  pgc_copy="$PGC_AGENT_COPY"
  unset PGC_AGENT_COPY
  pgc_install "$pgc_copy" "${pgc_copy%/agent/*}/bundles/${pgc_copy##*/}"
  exec bash "${pgc_copy%/agent/*}/bundles/${pgc_copy##*/}/step.sh" "$@"
fi
if [[ -n "${BASH_SOURCE[0]:-}" && -f "${BASH_SOURCE[0]}" && "${BASH_SOURCE[0]}" == */step.sh ]]; then
  pgc_bundle="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
  pgc_parent="${pgc_bundle%/*}"
  if [[ "${pgc_parent##*/}" == agent ]]; then
    # Run from the agent's copy: run the store's bundle instead (stdin, the secrets, goes with it unread).
    pgc_install "$pgc_bundle" "${pgc_parent%/*}/bundles/${pgc_bundle##*/}"
    exec bash "${pgc_parent%/*}/bundles/${pgc_bundle##*/}/step.sh" "$@"
  fi
  pgc_seen="$(pgc_fingerprint "$pgc_bundle")"
  if [[ "$pgc_seen" != "${pgc_bundle##*-}" && "${pgc_parent##*/}" == bundles && -d "${pgc_parent%/*}/agent/${pgc_bundle##*/}" ]]; then
    # A store bundle that is not what its name says: replaced from the agent's copy, then run.
    pgc_install "${pgc_parent%/*}/agent/${pgc_bundle##*/}" "$pgc_bundle"
    exec bash "$pgc_bundle/step.sh" "$@"
  fi
  if [[ "$pgc_seen" != "${pgc_bundle##*-}" ]]; then
    printf 'agent: bundle %s: expected fingerprint %s, saw %s (an incomplete or edited copy: replace this machine'"'"'s -agent resource with pulumi up --replace <its URN>)\n' \
      "$pgc_bundle" "${pgc_bundle##*-}" "$pgc_seen" >&2
    exit 1
  fi
  # python3 runs the agent's modules from here as root and would cache the imported ones (kubeapi.py) in a
  # __pycache__ beside them: the bundle must stay as copied, so no byte code is written (PYTHONDONTWRITEBYTECODE).
  export PYTHONDONTWRITEBYTECODE=1
  # The agent's Python modules sit beside this script; only the steps that call them read it.
  # shellcheck disable=SC2034
  PGC_AGENT_DIR="$pgc_bundle"
  if [[ ! -t 0 ]]; then
    while IFS= read -r pgc_line || [[ -n "$pgc_line" ]]; do
      [[ -n "$pgc_line" ]] || continue
      pgc_name="${pgc_line%%=*}"
      case "$pgc_name" in
      PGC_JOIN_TOKEN | PGC_CA_CERT_HASH) ;;
      *)
        # Never echo the line: it may be a secret that lost its name.
        echo "agent: stdin: expected NAME=<base64> lines for PGC_JOIN_TOKEN or PGC_CA_CERT_HASH, saw another line" >&2
        exit 2
        ;;
      esac
      if ! pgc_value="$(printf '%s' "${pgc_line#*=}" | base64 -d 2>/dev/null)"; then
        echo "agent: stdin: expected base64 for $pgc_name, saw text that does not decode" >&2
        exit 2
      fi
      printf -v "$pgc_name" '%s' "$pgc_value"
    done
    unset pgc_line pgc_name pgc_value
  fi
  unset pgc_seen pgc_parent
fi
