#!/usr/bin/env bash
# Step 2 of the guest bootstrap: nouveau blacklisted and, in host mode, the NVIDIA driver from Ubuntu's archive,
# pinned and held; in vfio mode (KubeVirt vm-passthrough) the GPUs bound to vfio-pci at boot instead. Kernel
# arguments (the IOMMU of a KubeVirt node) go to a GRUB drop-in. Sent after guest_lib.sh.
#
# Usage: guest_driver.sh --mode host|operator|vfio --branch NNN --flavor server|desktop --modules open|proprietary
#                        [--version X.Y[.Z]] [--kernel-arg ARG ...] [--vfio-id VENDOR:DEVICE ...] [--purge]
#                        [--rollout 1 --rollout-node NAME --rollout-api HOST:PORT ...] (guest_rollout.sh)
# On a node that has joined the cluster, a change that takes it out of service (a driver install, a kernel
# argument, a vfio binding, a reboot still due) first takes a rollout slot, cordons and drains it, so the new
# driver never meets running or new GPU pods; the verify step uncordons it. Sent after guest_rollout.sh.
# Packages: nvidia-headless-<branch>[-server][-open] (driver, DKMS module source, compute libraries; no X
# stack) and nvidia-utils-<branch>[-server] (nvidia-smi), from Ubuntu's restricted archive, plus the headers of the
# running kernel and the kernel-tracking headers metapackage, so DKMS builds the module for every later kernel.
# --purge (the destroy command, only when the spec asks): unhold and purge those packages, nothing else.
#
# A reboot is scheduled only when the running kernel cannot pick a change up: nouveau still bound, a different
# (or no loadable) nvidia module after a driver change, a kernel argument missing from /proc/cmdline, or (vfio) a
# GPU vfio-pci cannot take without one. A first install on a guest whose nouveau was blacklisted and unloaded by
# cloud-init loads the new module with modprobe, no reboot; a vfio guest needs one boot with the IOMMU on.
# Prints "driver: ..." and finally "reboot: scheduled" or "reboot: not-needed".
set -euo pipefail
# shellcheck disable=SC2034 # read by die() in guest_lib.sh
STEP="driver"

mode="" branch="" flavor="server" modules="open" version="" purge=0 kernel_args=() vfio_ids=()
while (($#)); do
  case "$1" in
  --mode) mode="$2" ;;
  --kernel-arg) kernel_args+=("$2") ;;
  --vfio-id) vfio_ids+=("$2") ;;
  --branch) branch="$2" ;;
  --flavor) flavor="$2" ;;
  --modules) modules="$2" ;;
  --version) version="$2" ;;
  --purge)
    purge=1
    shift
    continue
    ;;
  *) rollout_arg "$1" "$2" || die "unknown argument $1" ;;
  esac
  shift 2
done
rollout_check_args
[[ "$mode" =~ ^(host|operator|vfio)$ ]] || fail "--mode" "host, operator or vfio" "'$mode'"
for arg in "${kernel_args[@]}"; do
  [[ "$arg" =~ ^[a-z0-9_.-]+(=[A-Za-z0-9_.,:-]+)?$ ]] || fail "--kernel-arg" "key[=value]" "'$arg'"
done
for id in "${vfio_ids[@]}"; do
  [[ "$id" =~ ^[0-9a-f]{4}:[0-9a-f]{4}$ ]] || fail "--vfio-id" "a lower-case vendor:device id" "'$id'"
done
[[ "$mode" != vfio || ${#vfio_ids[@]} -gt 0 ]] || fail "--vfio-id" "at least one in vfio mode" "none"
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
GRUB_DROPIN="/etc/default/grub.d/90-proxmox-gpu-cluster.cfg"
VFIO_OPTIONS="/etc/modprobe.d/proxmox-gpu-cluster-vfio.conf"
VFIO_MODULES="/etc/modules-load.d/proxmox-gpu-cluster-vfio.conf"

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

# tracking_headers: the linux-headers metapackage of every installed kernel metapackage (linux-image-virtual ->
# linux-headers-virtual). With it, each kernel update (unattended-upgrades) brings that kernel's headers, and DKMS
# (nvidia-dkms, a dependency of the headless package) builds the NVIDIA module for it before the next boot.
tracking_headers() {
  local status pkg
  while read -r status pkg; do
    [[ "$status" == ii && "$pkg" =~ ^linux-image-([a-z][a-z0-9.-]*)$ ]] || continue
    printf 'linux-headers-%s\n' "${BASH_REMATCH[1]}"
  done < <(dpkg-query -W -f='${db:Status-Abbrev} ${Package}\n' 'linux-image-*' 2>/dev/null || true)
}

# follow_kernel_updates: the running kernel's headers and the kernel-tracking headers are installed (never held:
# they must follow the kernel). A guest that booted a kernel without headers (no module: nvidia-smi fails) is
# repaired here: the headers make DKMS build the module, which module_current then loads, without a reboot.
follow_kernel_updates() {
  local pkg running missing=()
  running="linux-headers-$(uname -r)"
  while read -r pkg; do
    [[ -n "$(installed_version "$pkg")" ]] || missing+=("$pkg")
  done < <(printf '%s\n' "$running"; tracking_headers)
  if ((${#missing[@]})); then
    apt_install "${missing[@]}"
    echo "driver: headers installed (${missing[*]}): DKMS builds the module for this and every later kernel"
    [[ " ${missing[*]} " != *" $running "* ]] || driver_changed=1
  fi
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

# configure_kernel_args: the GRUB drop-in holds exactly the wanted arguments (none: no drop-in). Ubuntu's cloud images source /etc/default/grub.d/*.cfg in order, after
# their own 50-cloudimg-settings.cfg, so appending keeps the console settings.
configure_kernel_args() {
  local before="$CHANGED"
  CHANGED=0
  if ((${#kernel_args[@]})); then
    # shellcheck disable=SC2016 # GRUB expands the variable when it sources the drop-in
    put "$GRUB_DROPIN" '# Managed by proxmox-gpu-cluster: the IOMMU a KubeVirt node needs
GRUB_CMDLINE_LINUX_DEFAULT="${GRUB_CMDLINE_LINUX_DEFAULT:-} '"${kernel_args[*]}"'"'
  else
    drop "$GRUB_DROPIN"
  fi
  if ((CHANGED)); then
    update-grub
  fi
  CHANGED=$((before | CHANGED))
}

# kernel_args_active: the running kernel was booted with every wanted argument.
kernel_args_active() {
  local running arg
  ((${#kernel_args[@]})) || return 0
  running=" $(cat "$ROOT/proc/cmdline") "
  for arg in "${kernel_args[@]}"; do
    [[ "$running" == *" $arg "* ]] || return 1
  done
}

# configure_vfio: in vfio mode, vfio-pci claims the GPU ids at boot (modules-load.d loads it; the softdeps order
# it before any GPU driver); in other modes none of that is left behind. Sets vfio_changed when a file changed.
vfio_changed=0
configure_vfio() {
  local before="$CHANGED" ids
  CHANGED=0
  if [[ "$mode" == vfio ]]; then
    ids="$(printf '%s\n' "${vfio_ids[@]}" | sort -u | paste -sd, -)"
    put "$VFIO_MODULES" "# Managed by proxmox-gpu-cluster: KubeVirt passes these GPUs to VMs
vfio
vfio_iommu_type1
vfio_pci"
    put "$VFIO_OPTIONS" "# Managed by proxmox-gpu-cluster: KubeVirt passes these GPUs to VMs
options vfio-pci ids=$ids
softdep nouveau pre: vfio-pci
softdep nvidia pre: vfio-pci"
  else
    drop "$VFIO_MODULES"
    drop "$VFIO_OPTIONS"
  fi
  vfio_changed=$CHANGED
  CHANGED=$((before | CHANGED))
}

# gpus_on_vfio: every function with a --vfio-id is bound to vfio-pci (loading vfio-pci binds unbound ones).
gpus_on_vfio() {
  local id dev
  loaded vfio_pci || modprobe vfio-pci >/dev/null 2>&1 || return 1
  for id in "${vfio_ids[@]}"; do
    while read -r dev; do
      [[ -z "$dev" || "$(bound_driver "$dev")" == vfio-pci ]] || return 1
    done < <(pci_devices "$id")
  done
}

# vfio_left_bound: a GPU (vendor 10de) is still bound to vfio-pci after leaving vfio mode.
vfio_left_bound() {
  local dev
  for dev in "$ROOT"/sys/bus/pci/devices/*; do
    [[ -f "$dev/vendor" && "$(cat "$dev/vendor")" == 0x10de && "$(bound_driver "$dev")" == vfio-pci ]] && return 0
  done
  return 1
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

# all_bound <driver>: every function with a --vfio-id is bound to it now (reads sysfs only).
all_bound() {
  local id dev
  for id in "${vfio_ids[@]}"; do
    while read -r dev; do
      [[ -z "$dev" || "$(bound_driver "$dev")" == "$1" ]] || return 1
    done < <(pci_devices "$id")
  done
}

# change_pending: whether this run would take the node out of service; prints why. Changes nothing.
change_pending() {
  local have
  if [[ "$mode" == host ]]; then
    have="$(installed_version "$driver_pkg")"
    if [[ -z "$have" || "$(installed_version "$utils_pkg")" != "$have" ]]; then
      echo "install $driver_pkg${version:+ $version}"
      return 0
    elif [[ -n "$version" && "$have" != "$version"-* ]]; then
      echo "driver $have -> $version"
      return 0
    fi
  fi
  if ! kernel_args_active; then
    echo "kernel arguments ${kernel_args[*]}"
  elif loaded nouveau; then
    echo "nouveau to unload"
  elif [[ "$mode" == vfio ]] && ! all_bound vfio-pci; then
    echo "GPUs to vfio-pci"
  elif [[ "$mode" != vfio ]] && vfio_left_bound; then
    echo "GPUs off vfio-pci"
  else
    return 1
  fi
}

main() {
  local why
  if ((purge)); then
    [[ "$mode" == host ]] && purge_driver
    return 0
  fi
  # Local checks first: an unchanged node never asks the API server anything.
  if why="$(change_pending)" && rollout_joined; then
    rollout_begin "$why"
  fi
  blacklist_nouveau
  configure_kernel_args
  configure_vfio
  case "$mode" in
  host)
    install_driver
    follow_kernel_updates
    ;;
  vfio) echo "driver: none; GPUs bound to vfio-pci for KubeVirt" ;;
  *) echo "driver: left to the GPU Operator" ;;
  esac
  local reboot=0
  if ! nouveau_gone; then
    reboot=1
  elif ! kernel_args_active; then
    reboot=1
  elif [[ "$mode" == vfio ]] && ! gpus_on_vfio; then
    reboot=1
  elif [[ "$mode" != vfio ]] && ((vfio_changed)) && vfio_left_bound; then
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
