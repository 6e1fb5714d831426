#!/usr/bin/env bash
# Helpers shared by the guest bootstrap steps (guest_*.sh). Never run alone: each step travels to the guest as
# this file followed by the step's script on stdin (`bash -s -- <args>`), so no file has to be copied first.
#
# Every step wraps its work in main() and calls `main "$@" </dev/null` on its last line: bash reads a script on
# stdin line by line, so a command that read stdin while the script was still arriving would eat the rest of
# it; by the time main runs, bash has read all of it, and its commands get /dev/null instead.
#
# Every path is under $PGC_ROOT (empty on a real host) so tests can run the steps against a fake root.
# Failures print "guest-bootstrap: <step>: <what>: expected <x>, seen <y>" on stderr and exit 1.
set -euo pipefail
umask 022

ROOT="${PGC_ROOT:-}"
STEP="guest"
CHANGED=0
APT_UPDATED=0
export DEBIAN_FRONTEND=noninteractive

die() {
  printf 'guest-bootstrap: %s: %s\n' "$STEP" "$*" >&2
  exit 1
}

fail() {
  die "$1: expected $2, seen $3"
}

# put <path> <content> [mode]: write the file only when its content differs; CHANGED=1 and a line when written.
# shellcheck disable=SC2034 # CHANGED is read by the steps that care
put() {
  local path="$1" content="$2" mode="${3:-0644}" file="$ROOT$1"
  if [[ -f "$file" ]] && [[ "$(cat "$file")" == "$content" ]]; then
    return 0
  fi
  mkdir -p "$(dirname "$file")"
  printf '%s\n' "$content" >"$file.pgc-tmp"
  chmod "$mode" "$file.pgc-tmp"
  mv "$file.pgc-tmp" "$file"
  echo "changed: $path"
  CHANGED=1
}

# drop <path>: remove a file this project wrote, if present; CHANGED=1 and a line when removed.
drop() {
  if [[ -e "$ROOT$1" ]]; then
    rm -f "$ROOT$1"
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

# installed_version <package>: its version when installed, else nothing.
installed_version() {
  local status="" version=""
  read -r status version < <(dpkg-query -W -f='${db:Status-Abbrev} ${Version}\n' "$1" 2>/dev/null || true) || true
  if [[ "$status" == ii ]]; then
    printf '%s\n' "$version"
  fi
}

apt_update() {
  if ((APT_UPDATED == 0)); then
    apt-get update -q
    APT_UPDATED=1
  fi
}

# apt_install <package[=version]>...: held packages may change (the version in the argument is the new pin).
apt_install() {
  apt_update
  apt-get install -y -q --allow-change-held-packages \
    -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "$@"
  echo "installed: $*"
}

# candidate <package> <upstream version>: the newest available package version of that upstream version.
candidate() {
  apt-cache madison "$1" | awk -v want="$2-" '{ if (index($3, want) == 1) { print $3; exit } }'
}

# hold <package>...: apt-mark hold the ones not held yet.
hold() {
  local held pkg todo=()
  held="$(apt-mark showhold)"
  for pkg in "$@"; do
    grep -qxF "$pkg" <<<"$held" || todo+=("$pkg")
  done
  if ((${#todo[@]})); then
    apt-mark hold "${todo[@]}"
  fi
}

# apt_repo <name> <key url> <repository and suite>: a signed-by keyring under /etc/apt/keyrings and a list file.
apt_repo() {
  local keyring="/etc/apt/keyrings/$1.gpg"
  if [[ ! -s "$ROOT$keyring" ]]; then
    mkdir -p "$ROOT/etc/apt/keyrings"
    curl -fsSL --retry 3 "$2" | gpg --dearmor --yes -o "$ROOT$keyring"
    chmod 0644 "$ROOT$keyring"
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
