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

# Files host prep manages, under ROOT (empty on a real host); STATE keeps its bookkeeping; changed lists the files a
# run rewrote or removed.
ROOT="${PGC_ROOT:-}"
STATE="$ROOT/var/lib/proxmox-gpu-cluster"
changed=()

# put_file <file> <content>: atomically (a temporary file in the same directory, fsync, rename, fsync of the
# directory), so a killed or failing write leaves the old file or the new one, never a truncated one. ENOSPC or a
# read-only file system fail the step naming the file.
put_file() {
  local file="$1" content="$2" dir="${1%/*}" tmp err
  [[ -d "$dir" ]] || err="$(mkdir -p "$dir" 2>&1)" || fail write "directory ${dir#"$ROOT"}" "${err:-mkdir failing}"
  rm -f "$file".pgc-?????? # a killed run's leftover (between mktemp and mv) of this very file
  tmp="$(mktemp "$file.pgc-XXXXXX" 2>&1)" || fail write "a temporary file next to ${file#"$ROOT"}" "$tmp"
  if ! err="$({
    printf '%s\n' "$content" >"$tmp" && chmod 0644 "$tmp" && sync "$tmp" && mv -f "$tmp" "$file" && sync "$dir"
  } 2>&1)"; then
    rm -f "$tmp"
    fail write "${file#"$ROOT"} written" "${err:-an error}"
  fi
}

# sweep_leftovers <dir...>: remove the temporary files (put_file's <file>.pgc-XXXXXX) a run killed between mktemp and
# mv left in these directories. Called with the host lock held, so no other run is writing one of them: every such
# file is a leftover, also one of a file no later run writes again (a released owner's drop-in, a reboot record).
sweep_leftovers() {
  local dir err
  for dir in "$@"; do
    [[ -d "$dir" ]] || continue
    err="$(find "$dir" -maxdepth 1 -type f -name '*.pgc-??????' -delete 2>&1)" ||
      fail write "the temporary files a killed run left in ${dir#"$ROOT"} removed" "${err:-an error}"
  done
}

# mark <name>: the pending marker of a regeneration (empty, so creating it is atomic), made durable at once.
mark() {
  local err
  [[ ! -e "$STATE/$1-pending" ]] || return 0
  err="$({ mkdir -p "$STATE" && : >"$STATE/$1-pending" && sync "$STATE/$1-pending" "$STATE"; } 2>&1)" ||
    fail write "${STATE#"$ROOT"}/$1-pending written" "${err:-an error}"
}

# differs <file> <content>: whether the file is missing or holds something else.
differs() {
  [[ ! -f "$1" ]] || [[ "$(<"$1")" != "$2" ]]
}

# put <file> <content>: write it when it differs (leftover temporary files of a killed run go first); remember it.
put() {
  local file="$1" content="$2"
  rm -f "$file".pgc-??????
  differs "$file" "$content" || return 0
  put_file "$file" "$content"
  changed+=("${file#"$ROOT"}")
}

# regenerate <name> <command...>: rebuild what boots from the files. The pending marker is written first and
# removed only after the tool succeeded, so a run that fails or is cut off in between is redone by the next one.
# The tool's output goes to stderr (stdout is the step's report); on failure it follows the step's line.
regenerate() {
  local name="$1" out rc=0
  shift
  mark "$name"
  out="$("$@" 2>&1)" || rc=$?
  if ((rc)); then
    echo "${STEP:-host}: $name: expected '$*' to exit 0, saw exit $rc (the next run redoes it; its output follows)" >&2
    printf '%s\n' "$out" >&2
    exit 1
  fi
  [[ -z "$out" ]] || printf '%s\n' "$out" >&2
}

# drop <file>: remove it when present (leftover temporary files of a killed run too); remember it.
drop() {
  local err
  rm -f "$1".pgc-??????
  [[ -e "$1" ]] || return 0
  err="$({ rm -f "$1" && sync "${1%/*}"; } 2>&1)" || fail write "${1#"$ROOT"} removed" "${err:-an error}"
  changed+=("${1#"$ROOT"} (removed)")
}
