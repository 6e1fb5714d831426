#!/usr/bin/env bash
# Helpers shared by the guest bootstrap steps (guest_*.sh). Never run alone: each step runs as this file followed by
# the step's script (on stdin as `bash -s -- <args>`, or as one file installed on the machine).
#
# Every step wraps its work in main() and calls `main "$@" </dev/null` on its last line: bash reads a script on
# stdin line by line, so a command that read stdin while the script was still arriving would eat the rest of
# it; by the time main runs, bash has read all of it, and its commands get /dev/null instead.
#
# Every path is under $PGC_ROOT (empty on a real host) so tests can run the steps against a fake root.
# Failures print one line "<step>: <what>: expected <x>, saw <y>" on stderr (the tool's own output below it) and
# exit 1; a command that fails where no check expected it prints "<step>: <command> failed: expected exit 0, saw
# exit <n>" (the ERR trap below).
#
# Convergence: a step decides from what it observes (the loaded module, /proc/cmdline, the generated grub.cfg,
# the dpkg status, the holds, kubelet's files), never from what an earlier run did; where a change cannot be
# observed afterwards (a regenerated initramfs, a daemon restarted with a file), a marker under $STATE_DIR is
# written BEFORE the change and removed once it is done, so a run killed in between does it again.
set -euo pipefail
set -E # the ERR trap fires inside functions too
umask 022

ROOT="${PGC_ROOT:-}"
STEP="guest"
CHANGED=0
APT_UPDATED=0
STATE_DIR="/var/lib/proxmox-gpu-cluster"
LOCK="/run/lock/proxmox-gpu-cluster.lock"
# How long a step waits for another step on this machine, and apt for dpkg's lock (unattended-upgrades).
LOCK_WAIT="${PGC_LOCK_WAIT:-900}"
APT_LOCK_WAIT="${PGC_APT_LOCK_WAIT:-600}"
export DEBIAN_FRONTEND=noninteractive

# on_err <exit code> <command>: the ERR trap. Only the step's own shell reports (a failing command inside $(...)
# is reported by the command that used it), so a failure prints one line.
on_err() {
  if [[ "$BASHPID" == "$$" ]]; then
    printf '%s: %s failed: expected exit 0, saw exit %s\n' "$STEP" "$2" "$1" >&2
  fi
}
trap 'on_err $? "$BASH_COMMAND"' ERR

die() {
  printf '%s: %s\n' "$STEP" "$*" >&2
  exit 1
}

fail() {
  die "$1: expected $2, saw $3"
}

# fail_output <output> <what> <expected> <exit code>: the failure line, naming the tool's first error line, then
# the tool's whole output.
fail_output() {
  local first
  first="$(grep -m 1 -E '^(E: |Error!|ERROR|error|FATA|Failed|\[ERROR|[a-z-]+: (\([0-9]+\) )?[A-Z])' <<<"$1" || true)"
  [[ -n "$first" ]] || first="$(grep -m 1 . <<<"$1" || true)"
  printf '%s: %s: expected %s, saw exit %s: %s\n%s\n' "$STEP" "$2" "$3" "$4" "$first" "$1" >&2
  exit 1
}

# tool <what> <command...>: run a command whose failure is a clear stop: its output goes to stdout when it
# succeeds, and below the failure line when it does not.
tool() {
  local what="$1" out rc=0
  shift
  out="$("$@" 2>&1)" || rc=$?
  ((rc == 0)) || fail_output "$out" "$what" "exit 0" "$rc"
  [[ -z "$out" ]] || printf '%s\n' "$out"
}

# guest_begin: the start of every step's main. One step at a time on a machine: a second one waits (bounded) for
# the per-machine lock and then fails naming the holder. Then the secret files a killed run left under /run go.
guest_begin() {
  mkdir -p "$ROOT/run/lock"
  exec 9<>"$ROOT$LOCK"
  if ! flock -w "$LOCK_WAIT" 9; then
    fail "lock $LOCK" "free within ${LOCK_WAIT}s" "held by $(head -n 1 "$ROOT$LOCK" 2>/dev/null || echo unknown)"
  fi
  printf '%s (pid %s)\n' "$STEP" "$$" >"$ROOT$LOCK"
  stale_secrets "$ROOT/run/pgc-join"
  # Admin kubeconfig files of versions before the steps acted as the node (2026-11): a run killed then left them.
  stale_secrets "$ROOT/run/pgc-kubeconfig"
  stale_secrets "$ROOT/run/pgc-drain"
}

# stale_secrets <path prefix>: remove <prefix>.* files whose run (the pid after the prefix) is gone, and those of
# an older naming without a pid: a killed step cannot remove its own, and a running step's file is never touched.
stale_secrets() {
  local file pid
  for file in "$1".*; do
    [[ -e "$file" ]] || continue
    pid="${file#"$1".}"
    pid="${pid%%.*}"
    if [[ ! "$pid" =~ ^[0-9]+$ ]] || ! kill -0 "$pid" 2>/dev/null; then
      rm -rf "$file"
    fi
  done
}

# boot_id: this boot's id (changes with every boot).
boot_id() {
  cat "$ROOT/proc/sys/kernel/random/boot_id"
}

# marker <name>: whether the marker is set; mark <name> [content]; unmark <name>.
marker() {
  [[ -e "$ROOT$STATE_DIR/$1" ]]
}
mark() {
  record "$STATE_DIR/$1" "${2:-$(boot_id)}"
}
unmark() {
  if [[ -e "$ROOT$STATE_DIR/$1" ]]; then
    rm -f "$ROOT$STATE_DIR/$1"
    sync_dir "$STATE_DIR"
  fi
}

sync_dir() {
  sync "$ROOT$1" 2>/dev/null || true # durability only: a file system that cannot sync a directory still renamed
}

# record <path> <content> [mode]: write the file atomically (a temp file in the same directory, fsync, rename), so a
# reader sees the old or the new content, never a part; fails with a clear line (ENOSPC, read-only file system).
# The temp file's name is fixed, so one a killed run left is reused, not left behind.
record() {
  local path="$1" content="$2" mode="${3:-0644}" file="$ROOT$1" err
  local tmp="$file.pgc-new"
  err="$({ mkdir -p "$(dirname "$file")" && printf '%s\n' "$content" >"$tmp" && chmod "$mode" "$tmp" &&
    sync "$tmp" && mv -f "$tmp" "$file"; } 2>&1)" || {
    rm -f "$tmp" 2>/dev/null || true
    fail "write $path" "the file written" "${err##*: }"
  }
  sync_dir "$(dirname "$path")"
}

# put <path> <content> [mode]: write the file only when its content differs; CHANGED=1 and a line when written.
# shellcheck disable=SC2034 # CHANGED is read by the steps that care
put() {
  local path="$1" content="$2" mode="${3:-0644}" file="$ROOT$1"
  if [[ -f "$file" ]] && [[ "$(cat "$file")" == "$content" ]]; then
    return 0
  fi
  record "$path" "$content" "$mode"
  echo "changed: $path"
  CHANGED=1
}

# differs <path> <content>: the file is missing or holds something else (a change is due: set its marker first).
differs() {
  [[ ! -f "$ROOT$1" || "$(cat "$ROOT$1")" != "$2" ]]
}

# drop <path>: remove a file this project wrote, if present; CHANGED=1 and a line when removed.
drop() {
  if [[ -e "$ROOT$1" ]]; then
    rm -f "$ROOT$1"
    sync_dir "$(dirname "$1")"
    echo "changed: $1 (removed)"
    CHANGED=1
  fi
}

# pci_devices <vendor:device>: sysfs paths of the PCI functions with that id (ids as lspci -n prints them).
pci_devices() {
  local dev id
  for dev in "$ROOT"/sys/bus/pci/devices/*; do
    [[ -f "$dev/vendor" && -f "$dev/device" ]] || continue
    id="$(sed 's/^0x//' "$dev/vendor"):$(sed 's/^0x//' "$dev/device")"
    [[ "$id" == "$1" ]] && printf '%s\n' "$dev"
  done
  return 0
}

# bound_driver <sysfs device>: the driver bound to it, or nothing.
bound_driver() {
  if [[ -L "$1/driver" ]]; then
    basename "$(readlink "$1/driver")"
  fi
}

# installed_version <package>: its version when installed and configured (dpkg status ii, or hi when held: the
# first letter of ${db:Status-Abbrev} is the selection, the second the state; dpkg-query(1)), else nothing: a
# package a killed or failed run left unpacked (iU) or half-configured (iF) counts as missing.
installed_version() {
  local out status="" version=""
  out="$(dpkg-query -W -f='${db:Status-Abbrev} ${Version}\n' "$1" 2>/dev/null || true)"
  read -r status version <<<"$out" || true
  if [[ "$status" == [ih]i ]]; then
    printf '%s\n' "$version"
  fi
}

# apt <what> <apt-get arguments...>: apt-get waiting (bounded) for dpkg's lock, as unattended-upgrades may hold it
# right after boot; a failure names apt's first error line.
apt() {
  local what="$1"
  shift
  tool "$what" apt-get -o DPkg::Lock::Timeout="$APT_LOCK_WAIT" "$@"
}

apt_update() {
  if ((APT_UPDATED == 0)); then
    # --error-on=any: a repository that cannot be fetched (network, DNS) fails here, not as a missing package.
    apt "apt-get update" update -q --error-on=any
    APT_UPDATED=1
  fi
}

# dpkg_repair: finish what a killed or failed install left unpacked or half-configured (apt refuses to install
# anything until then). Its postinst scripts run now: DKMS builds the module of an unpacked driver.
dpkg_repair() {
  local audit
  audit="$(dpkg --audit 2>&1 || true)"
  if [[ -n "$audit" ]]; then
    echo "dpkg: finishing an interrupted install: $(tail -n +2 <<<"$audit" | awk '{ $1 = $1; print }' | paste -sd' ' -)"
    tool "dpkg --configure -a" dpkg --force-confdef --force-confold --configure -a
  fi
}

# apt_install <package[=version]>...: held packages may change and may go down (the version in the argument is the
# new pin: lowering a driver, toolkit or Kubernetes pin is a downgrade, which apt-get -y refuses without
# --allow-downgrades: "E: Packages were downgraded and -y was used without --allow-downgrades", exit 100, apt 2.6).
apt_install() {
  dpkg_repair
  apt_update
  apt "apt-get install" install -y -q --allow-change-held-packages --allow-downgrades \
    -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "$@"
  echo "installed: $*"
}

# candidate <package> <upstream version>: the newest available package version of that upstream version.
candidate() {
  apt-cache madison "$1" | awk -v want="$2-" '{ if (index($3, want) == 1) { print $3; exit } }'
}

# hold <package>...: apt-mark hold the ones not held now (checked on every run: a hold can be lost to a killed run
# or taken off by hand).
hold() {
  local held pkg todo=()
  held="$(apt-mark showhold)"
  for pkg in "$@"; do
    grep -qxF "$pkg" <<<"$held" || todo+=("$pkg")
  done
  if ((${#todo[@]})); then
    tool "apt-mark hold" apt-mark hold "${todo[@]}"
  fi
}

# keyring_valid <path>: the file is a complete OpenPGP keyring (a download cut short is not).
keyring_valid() {
  [[ -s "$ROOT$1" ]] && gpg --batch --show-keys "$ROOT$1" >/dev/null 2>&1
}

# apt_repo <name> <key url> <repository and suite>: a signed-by keyring under /etc/apt/keyrings and a list file.
# The keyring is checked on every run and fetched into a temp file that replaces it only once it is valid.
apt_repo() {
  local keyring="/etc/apt/keyrings/$1.gpg" tmp out rc=0
  if ! keyring_valid "$keyring"; then
    mkdir -p "$ROOT/etc/apt/keyrings"
    tmp="$keyring.pgc-new"
    out="$(curl -fsSL --retry 3 "$2" 2>&1 >"$ROOT$tmp.asc")" || rc=$?
    ((rc == 0)) || fail_output "$out" "curl $2" "the repository's signing key" "$rc"
    out="$(gpg --batch --dearmor --yes -o "$ROOT$tmp" <"$ROOT$tmp.asc" 2>&1)" || rc=$?
    rm -f "$ROOT$tmp.asc"
    ((rc == 0)) || fail_output "$out" "gpg --dearmor" "a keyring from $2" "$rc"
    keyring_valid "$tmp" || fail "$keyring" "a valid OpenPGP keyring from $2" "$(gpg --batch --show-keys "$ROOT$tmp" 2>&1 | tail -n 1 || true)"
    chmod 0644 "$ROOT$tmp"
    sync "$ROOT$tmp"
    mv -f "$ROOT$tmp" "$ROOT$keyring"
    echo "changed: $keyring"
    APT_UPDATED=0
  fi
  local before="$CHANGED"
  CHANGED=0
  put "/etc/apt/sources.list.d/$1.list" "deb [signed-by=$keyring] $3"
  if ((CHANGED)); then
    APT_UPDATED=0 # a new or changed repository: the next install must fetch its package lists first
  fi
  CHANGED=$((before | CHANGED))
}

# loaded <module>: whether the kernel has the module loaded.
loaded() {
  [[ -d "$ROOT/sys/module/$1" ]]
}
