#!/usr/bin/env bash
# Step 2 of the guest bootstrap: nouveau blacklisted and, in host mode, the NVIDIA driver from Ubuntu's archive,
# pinned and held. Sent after guest_lib.sh.
#
# Usage: guest_driver.sh --mode host|operator --branch NNN --flavor server|desktop --modules open|proprietary
#                        [--version X.Y[.Z]] [--purge]
# Packages: nvidia-headless-<branch>[-server][-open] (driver, DKMS module source, compute libraries; no X
# stack) and nvidia-utils-<branch>[-server] (nvidia-smi), from Ubuntu's restricted archive.
# --purge (the destroy command, only when the spec asks): unhold and purge those packages, nothing else.
#
# A reboot is scheduled only when this run changed the driver or the blacklist AND the running kernel cannot
# pick the change up: nouveau still bound, or a different (or no loadable) nvidia module. A first install on a
# guest whose nouveau was blacklisted and unloaded by cloud-init loads the new module with modprobe, no reboot.
# Prints "driver: ..." and finally "reboot: scheduled" or "reboot: not-needed".
set -euo pipefail
# shellcheck disable=SC2034 # read by die() in guest_lib.sh
STEP="driver"

mode="" branch="" flavor="server" modules="open" version="" purge=0
while (($#)); do
  case "$1" in
  --mode) mode="$2" ;;
  --branch) branch="$2" ;;
  --flavor) flavor="$2" ;;
  --modules) modules="$2" ;;
  --version) version="$2" ;;
  --purge)
    purge=1
    shift
    continue
    ;;
  *) die "unknown argument $1" ;;
  esac
  shift 2
done
[[ "$mode" =~ ^(host|operator)$ ]] || fail "--mode" "host or operator" "'$mode'"
[[ "$branch" =~ ^[0-9]{3}$ ]] || fail "--branch" "a three-digit branch" "'$branch'"
[[ "$flavor" =~ ^(server|desktop)$ ]] || fail "--flavor" "server or desktop" "'$flavor'"
[[ "$modules" =~ ^(open|proprietary)$ ]] || fail "--modules" "open or proprietary" "'$modules'"
[[ -z "$version" || "$version" =~ ^$branch\.[0-9]+(\.[0-9]+)?$ ]] || fail "--version" "a $branch.x version" "'$version'"

suffix=""
[[ "$flavor" == server ]] && suffix="-server"
driver_pkg="nvidia-headless-$branch$suffix"
[[ "$modules" == open ]] && driver_pkg="$driver_pkg-open"
utils_pkg="nvidia-utils-$branch$suffix"
BLACKLIST="/etc/modprobe.d/blacklist-nouveau.conf"

# blacklist_nouveau: make sure no boot loads nouveau; sets blacklist_changed when it had to.
blacklist_changed=0
blacklist_nouveau() {
  local dir
  for dir in /etc/modprobe.d /usr/lib/modprobe.d /lib/modprobe.d; do
    if grep -qsE '^[[:space:]]*blacklist[[:space:]]+nouveau([[:space:]]|$)' "$ROOT$dir"/*.conf; then
      return 0
    fi
  done
  put "$BLACKLIST" "# Managed by proxmox-gpu-cluster
blacklist nouveau
options nouveau modeset=0"
  update-initramfs -u
  blacklist_changed=1
}

# nouveau_gone: unload nouveau if it is bound (nothing uses it: the console is the emulated VGA).
nouveau_gone() {
  if loaded nouveau; then
    modprobe -r nouveau >/dev/null 2>&1 || true
  fi
  ! loaded nouveau
}

# install_driver: install or re-pin the driver packages; sets driver_changed when it did.
driver_changed=0
install_driver() {
  local have want
  have="$(installed_version "$driver_pkg")"
  if [[ -z "$version" ]]; then
    # Branch pin only: whatever 580.x is installed stays (the packages are held; upgrades are explicit).
    if [[ -n "$have" && -n "$(installed_version "$utils_pkg")" ]]; then
      echo "driver: $driver_pkg $have (present)"
      return 0
    fi
    apt_install "linux-headers-$(uname -r)" "$driver_pkg" "$utils_pkg"
  else
    if [[ "$have" == "$version"-* && "$(installed_version "$utils_pkg")" == "$have" ]]; then
      echo "driver: $driver_pkg $have (present)"
      return 0
    fi
    apt_update
    want="$(candidate "$driver_pkg" "$version")"
    [[ -n "$want" ]] || fail "$driver_pkg" "a $version-* package in the archive" \
      "$(apt-cache madison "$driver_pkg" | awk '{print $3}' | paste -sd, - || true)"
    apt_install "linux-headers-$(uname -r)" "$driver_pkg=$want" "$utils_pkg=$want"
  fi
  hold "$driver_pkg" "$utils_pkg"
  driver_changed=1
  echo "driver: $driver_pkg $(installed_version "$driver_pkg") (installed)"
}

# module_current: the running kernel has (or can load) the installed driver's module.
module_current() {
  local installed loaded_version
  installed="$(installed_version "$driver_pkg")"
  installed="${installed%%-*}"
  if ! loaded nvidia; then
    modprobe nvidia >/dev/null 2>&1 || return 1
  fi
  loaded_version="$(cat "$ROOT/sys/module/nvidia/version" 2>/dev/null || true)"
  [[ "$loaded_version" == "$installed" ]]
}

purge_driver() {
  local pkgs=() pkg
  for pkg in "$driver_pkg" "$utils_pkg"; do
    [[ -n "$(installed_version "$pkg")" ]] && pkgs+=("$pkg")
  done
  if ((${#pkgs[@]} == 0)); then
    echo "driver: nothing to purge"
    return 0
  fi
  apt-mark unhold "${pkgs[@]}"
  apt-get purge -y -q "${pkgs[@]}"
  echo "driver: purged ${pkgs[*]} (the running module stays until the next boot)"
}

main() {
  if ((purge)); then
    [[ "$mode" == host ]] && purge_driver
    return 0
  fi
  blacklist_nouveau
  if [[ "$mode" == host ]]; then
    install_driver
  else
    echo "driver: left to the GPU Operator"
  fi
  local reboot=0
  if ! nouveau_gone; then
    reboot=1
  elif ((driver_changed)) && ! module_current; then
    reboot=1
  fi
  if ((reboot)); then
    # Delayed so this SSH session ends cleanly; the bootstrap's wait step sees the guest go down and return.
    systemd-run --on-active=5 --unit=pgc-guest-reboot systemctl reboot >/dev/null
    echo "reboot: scheduled"
  else
    ((blacklist_changed)) && echo "blacklist: nouveau blacklisted; not loaded, no reboot needed"
    echo "reboot: not-needed"
  fi
}

main "$@" </dev/null
