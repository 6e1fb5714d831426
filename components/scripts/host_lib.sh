#!/usr/bin/env bash
# Helpers shared by the Proxmox host steps (host_prep.sh, host_verify.sh, large_bar.sh): each step's bundle is this
# file followed by the step's script (render/agent_bundle.py). The step sets STEP (its name in failure lines).
set -euo pipefail
set -E # the ERR trap below also fires in functions

# fail <what> <expected> <saw>: the step's one failure line, "<step>: <what>: expected <x>, saw <y>", and exit 1.
fail() {
  echo "${STEP:-host}: $1: expected $2, saw $3" >&2
  exit 1
}

# A command failing where no check expects it still names itself (its own output is above). Inside a command
# substitution the trap only exits: the assignment around it fails next and is named by the outer shell.
on_error() {
  ((BASH_SUBSHELL)) || echo "${STEP:-host}: ${BASH_COMMAND} failed: expected exit 0, saw exit $1" >&2
  exit "$1"
}
trap 'on_error $?' ERR

HOST_LOCK="${PGC_ROOT:-}/run/lock/proxmox-gpu-cluster.lock"

# host_lock <holder>: one step at a time on this node: host prep, host verify and the large-BAR steps of its workers
# read and change the same state. The flock dies with its holder (even a SIGKILLed one), so a killed run never
# blocks the next; the wait is bounded (PGC_LOCK_WAIT, default 600 s) and the failure names the holder. fd 9
# stays open to the end of the step (close it, 9>&-, for anything that outlives the step, such as a VM's QEMU).
host_lock() {
  local wait="${PGC_LOCK_WAIT:-600}" holder
  mkdir -p "${HOST_LOCK%/*}"
  exec 9<>"$HOST_LOCK"
  if ! flock -w "$wait" 9; then
    holder="$(head -n 1 "$HOST_LOCK" 2>/dev/null || true)"
    fail lock "${HOST_LOCK#"${PGC_ROOT:-}"} free within ${wait}s" "it held by ${holder:-an unknown process}"
  fi
  printf '%s (pid %s) since %s\n' "$1" "$$" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" >"$HOST_LOCK"
}
