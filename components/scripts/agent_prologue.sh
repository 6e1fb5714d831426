#!/usr/bin/env bash
# The node agent's prologue: the first lines of every step's script as it is installed on a machine
# (~/.proxmox-gpu-cluster/agent/<step>-<fingerprint>/step.sh, see render/agent_bundle.py).
#
# 1. The bundle checks itself: its directory's name ends in the fingerprint of its files (sha256 of the
#    `sha256sum` listing of the files, C locale order), so a copy that was cut short or edited by hand stops here
#    instead of running half a script.
# 2. Secrets arrive on stdin and only there, one `NAME=<base64>` line each, for the known names only; they become
#    shell variables (never exported, never arguments, never files). A step run from text on stdin (`bash -s`, as
#    the tests still do for some scripts) has no file of its own and skips both.
set -euo pipefail

if [[ -n "${BASH_SOURCE[0]:-}" && -f "${BASH_SOURCE[0]}" && "${BASH_SOURCE[0]}" == */step.sh ]]; then
  pgc_bundle="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
  # The bundle's files only: a directory beside them (a __pycache__ an older python3 run left) is no part of it.
  pgc_files=()
  for pgc_file in "$pgc_bundle"/*; do
    [[ -f "$pgc_file" ]] && pgc_files+=("${pgc_file##*/}")
  done
  pgc_seen="$(cd "$pgc_bundle" && LC_ALL=C sha256sum -- "${pgc_files[@]}" | sha256sum | cut -c1-12)"
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
  unset pgc_seen pgc_files pgc_file
fi
