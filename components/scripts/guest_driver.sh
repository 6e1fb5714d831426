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
# Packages, from Ubuntu's restricted archive, with the rest of their family at the same build (guest_driver_apt.sh,
# sent before this file): nvidia-utils-<branch>[-server] (nvidia-smi) and the driver without an X stack, its kernel
# module either Ubuntu's precompiled, signed one for the running kernel (nvidia-headless-no-dkms-...[-open] plus
# linux-modules-nvidia-...-<kernel>: no build, loads under Secure Boot) when the archive has it built against the
# chosen build, or else built by DKMS (nvidia-headless-<branch>[-server][-open] plus the running kernel's headers
# and the kernel-tracking headers metapackage, so DKMS builds it for every later kernel).
# --purge (the destroy command, only when the spec asks): unhold and purge those packages, nothing else.
#
# A reboot is scheduled only when the running kernel cannot pick a change up, as observed on every run: nouveau
# still bound, a loaded nvidia module that is not the installed build (or none loadable), a kernel argument missing
# from /proc/cmdline, or (vfio) a GPU vfio-pci cannot take without one. A first install on a guest whose nouveau
# was blacklisted and unloaded by cloud-init loads the new module with modprobe, no reboot; a vfio guest needs one
# boot with the IOMMU on. The reboot marker ($STATE_DIR/reboot.pending: boot id and reason) is written before the
# reboot is scheduled; a later boot that still needs a reboot for the same reason stops with a clear error instead
# of rebooting again (the verify step clears the marker once the node passed after that boot). The GRUB drop-in and
# the modprobe files are regenerated into grub.cfg and the initramfs under markers set before the files change.
# Prints "driver: ..." and finally "reboot: scheduled" (after "driver: reboot needed: expected <x>, saw <y>") or
# "reboot: not-needed". --mig-mode INDEX=1|0 (host mode): the MIG mode, set before the join (guest_mig_mode.sh).
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
  *) mig_mode_arg "$1" "$2" || rollout_arg "$1" "$2" || die "unknown argument $1" ;;
  esac
  shift 2
done
rollout_check_args
((${#MIG_MODES[@]} == 0)) || [[ "$mode" == host ]] || fail "--mig-mode" "host driver mode (else mig-manager sets it)" "$mode"
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

suffix="" open=""
[[ "$flavor" == server ]] && suffix="-server"
[[ "$modules" == open ]] && open="-open"
dkms_pkg="nvidia-headless-$branch$suffix$open"        # the driver with DKMS (its dependency nvidia-dkms builds)
# shellcheck disable=SC2034 # nodkms_pkg and nvidia_dkms: read in guest_driver_apt.sh
{
  nodkms_pkg="nvidia-headless-no-dkms-$branch$suffix$open" # the driver without a module (precompiled modules)
  nvidia_dkms="nvidia-dkms-$branch$suffix$open"
}
utils_pkg="nvidia-utils-$branch$suffix"
driver_pkg="$dkms_pkg" # what this node runs: set from the machine by driver_anchor (guest_driver_apt.sh)
BLACKLIST="/etc/modprobe.d/blacklist-nouveau.conf"
GRUB_DROPIN="/etc/default/grub.d/90-proxmox-gpu-cluster.cfg"
VFIO_OPTIONS="/etc/modprobe.d/proxmox-gpu-cluster-vfio.conf"
VFIO_MODULES="/etc/modules-load.d/proxmox-gpu-cluster-vfio.conf"
blacklist_changed=0

# blacklist_nouveau: make sure no boot loads nouveau: the blacklist in the root file system and in the initramfs
# (regenerated under the initramfs marker, so a run killed before update-initramfs regenerates it next time).
blacklist_nouveau() {
  local dir
  for dir in /etc/modprobe.d /usr/lib/modprobe.d /lib/modprobe.d; do
    if grep -qsE '^[[:space:]]*blacklist[[:space:]]+nouveau([[:space:]]|$)' "$ROOT$dir"/*.conf; then
      return 0
    fi
  done
  mark initramfs.pending
  put "$BLACKLIST" "# Managed by proxmox-gpu-cluster
blacklist nouveau
options nouveau modeset=0"
  blacklist_changed=1
}

# regenerate_initramfs: the initramfs packs /etc/modprobe.d; regenerated when a change set the marker.
regenerate_initramfs() {
  if marker initramfs.pending; then
    tool "update-initramfs -u" update-initramfs -u
    unmark initramfs.pending
  fi
}

# nouveau_gone: unload nouveau if it is bound (nothing uses it: the console is the emulated VGA).
nouveau_gone() {
  if loaded nouveau; then
    modprobe -r nouveau >/dev/null 2>&1 || true
  fi
  ! loaded nouveau
}

# grub_cfg_has_args: the generated /boot/grub/grub.cfg boots every wanted argument (what the next boot gets; the
# drop-in only counts once update-grub has run). No grub.cfg to read: only the marker tells.
grub_cfg_has_args() {
  local line arg cfg="$ROOT/boot/grub/grub.cfg"
  ((${#kernel_args[@]})) && [[ -f "$cfg" ]] || return 0
  line=" $(grep -m 1 -E '^[[:space:]]*linux[[:space:]]' "$cfg" || true) "
  for arg in "${kernel_args[@]}"; do
    [[ "$line" == *[[:space:]]"$arg"[[:space:]]* ]] || return 1
  done
}

# configure_kernel_args: the GRUB drop-in holds exactly the wanted arguments (none: no drop-in) and grub.cfg is
# generated from it. Ubuntu's cloud images source /etc/default/grub.d/*.cfg in order, after their own
# 50-cloudimg-settings.cfg, so appending keeps the console settings. The grub marker is set before the drop-in
# changes and cleared after update-grub, so a run killed in between regenerates grub.cfg next time.
configure_kernel_args() {
  # shellcheck disable=SC2016 # GRUB expands the variable when it sources the drop-in
  local content='# Managed by proxmox-gpu-cluster: the IOMMU a KubeVirt node needs
GRUB_CMDLINE_LINUX_DEFAULT="${GRUB_CMDLINE_LINUX_DEFAULT:-} '"${kernel_args[*]}"'"'
  if ((${#kernel_args[@]})); then
    if differs "$GRUB_DROPIN" "$content"; then
      mark grub.pending
      put "$GRUB_DROPIN" "$content"
    fi
  elif [[ -e "$ROOT$GRUB_DROPIN" ]]; then
    mark grub.pending
    drop "$GRUB_DROPIN"
  fi
  if marker grub.pending || ! grub_cfg_has_args; then
    tool update-grub update-grub
    unmark grub.pending
  fi
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
# it before any GPU driver); in other modes none of that is left behind. The initramfs, which packs
# /etc/modprobe.d, is regenerated after a change (marker first).
configure_vfio() {
  local ids modules options
  if [[ "$mode" == vfio ]]; then
    ids="$(printf '%s\n' "${vfio_ids[@]}" | sort -u | paste -sd, -)"
    modules="# Managed by proxmox-gpu-cluster: KubeVirt passes these GPUs to VMs
vfio
vfio_iommu_type1
vfio_pci"
    options="# Managed by proxmox-gpu-cluster: KubeVirt passes these GPUs to VMs
options vfio-pci ids=$ids
softdep nouveau pre: vfio-pci
softdep nvidia pre: vfio-pci"
    if differs "$VFIO_MODULES" "$modules" || differs "$VFIO_OPTIONS" "$options"; then
      mark initramfs.pending
      put "$VFIO_MODULES" "$modules"
      put "$VFIO_OPTIONS" "$options"
    fi
  elif [[ -e "$ROOT$VFIO_MODULES" || -e "$ROOT$VFIO_OPTIONS" ]]; then
    mark initramfs.pending
    drop "$VFIO_MODULES"
    drop "$VFIO_OPTIONS"
  fi
}

# gpus_on_vfio: every function with a --vfio-id is bound to vfio-pci (loading vfio-pci binds unbound ones).
gpus_on_vfio() {
  loaded vfio_pci || modprobe vfio-pci >/dev/null 2>&1 || return 1
  all_bound vfio-pci
}

# vfio_left_bound: a GPU (vendor 10de) is still bound to vfio-pci.
vfio_left_bound() {
  local dev
  for dev in "$ROOT"/sys/bus/pci/devices/*; do
    [[ -f "$dev/vendor" && "$(cat "$dev/vendor")" == 0x10de && "$(bound_driver "$dev")" == vfio-pci ]] && return 0
  done
  return 1
}

# module_version: the version of the nvidia module the kernel runs, or nothing.
module_version() {
  cat "$ROOT/sys/module/nvidia/version" 2>/dev/null || true
}

# installed_upstream: the upstream version of the installed driver package (580.95.05), or nothing.
installed_upstream() {
  local have
  have="$(installed_version "$driver_pkg")"
  printf '%s\n' "${have%%-*}"
}

# module_kind: the kind of the nvidia module the kernel runs: proprietary when the kernel marks it P (a licence
# that is not GPL-compatible; NVIDIA's open modules are "Dual MIT/GPL"), open otherwise
# (Documentation/ABI/testing/sysfs-module: /sys/module/<name>/taint).
module_kind() {
  if grep -qs P "$ROOT/sys/module/nvidia/taint"; then echo proprietary; else echo open; fi
}

# host_module_left: operator and vfio modes: the host driver was removed in this boot and its module is still loaded
# and cannot be unloaded now (a drained node normally lets it go: nothing holds /dev/nvidia*). A later boot has
# none of it, so the marker goes; so does the module the operator's driver container loads, which is not ours.
host_module_left() {
  local boot=""
  marker host-driver.removed || return 1
  read -r boot <"$ROOT$STATE_DIR/host-driver.removed" || true
  if [[ "$boot" == "$(boot_id)" ]] && loaded nvidia; then
    modprobe -r nvidia_uvm nvidia_drm nvidia_modeset nvidia >/dev/null 2>&1 || true
    loaded nvidia && return 0
  fi
  unmark host-driver.removed
  return 1
}

# module_current: the running kernel has (or loads now) the installed driver's module, of the wanted kind (a
# kernelModuleType change at the same build swaps the packages, not the loaded module).
module_current() {
  if ! loaded nvidia; then
    modprobe nvidia >/dev/null 2>&1 || return 1
  fi
  [[ "$(module_version)" == "$(installed_upstream)" && "$(module_kind)" == "$modules" ]]
}

# all_bound <driver>: every function with a --vfio-id is bound to it now (reads sysfs only).
all_bound() {
  local id dev devs
  for id in "${vfio_ids[@]}"; do
    devs="$(pci_devices "$id")"
    while read -r dev; do
      [[ -z "$dev" || "$(bound_driver "$dev")" == "$1" ]] || return 1
    done <<<"$devs"
  done
}

# reboot_reason: why the running kernel cannot take the wanted state without a boot, as "<key>|<expected>|<seen>";
# nothing (exit 1) when it can. Observed every run, whatever an earlier run did or was killed doing.
reboot_reason() {
  if ! nouveau_gone; then
    echo "nouveau|nouveau not loaded (blacklisted)|nouveau loaded and busy"
  elif ! kernel_args_active; then
    echo "kernel-args|${kernel_args[*]} in /proc/cmdline|$(cat "$ROOT/proc/cmdline")"
  elif [[ "$mode" == vfio ]] && ! gpus_on_vfio; then
    echo "vfio|every ${vfio_ids[*]} GPU on vfio-pci|another driver or none"
  elif [[ "$mode" != vfio ]] && vfio_left_bound; then
    echo "vfio-left|no GPU on vfio-pci|a GPU bound to vfio-pci"
  elif [[ "$mode" != host ]] && host_module_left; then
    echo "host-module|no host nvidia module (driver mode $mode)|the removed host driver's module $(module_version) loaded"
  elif [[ "$mode" == host ]] && ! module_current; then
    echo "module|nvidia module $(installed_upstream) ($modules)|$(module_version | grep . || echo 'none loadable')$(loaded nvidia && echo " ($(module_kind))")"
  else
    return 1
  fi
}

# schedule_reboot <reason>: a delayed reboot (so this SSH session ends cleanly; the bootstrap's wait step sees the
# guest go down and return), recorded first in the reboot marker with this boot's id. A marker of an earlier boot
# for the same reason means that reboot did not fix it: stop instead of rebooting forever.
schedule_reboot() {
  local key expected seen old_boot="" old_key="" out rc=0
  IFS='|' read -r key expected seen <<<"$1"
  if marker reboot.pending; then
    read -r old_boot old_key <"$ROOT$STATE_DIR/reboot.pending" || true
  fi
  if [[ -n "$old_boot" && "$old_boot" != "$(boot_id)" && "$old_key" == "$key" ]]; then
    fail "after the reboot from boot $old_boot" "$expected" "$seen (the boot did not apply it: check /boot/grub/grub.cfg and the boot loader; remove $STATE_DIR/reboot.pending to let the next run reboot again)"
  fi
  mark reboot.pending "$(boot_id) $key"
  out="$(systemd-run --on-active=5 --unit=pgc-guest-reboot systemctl reboot 2>&1)" || rc=$?
  if ((rc)) && ! systemctl is-active --quiet pgc-guest-reboot.timer; then
    fail_output "$out" "systemd-run (reboot)" "a scheduled reboot" "$rc"
  fi
  echo "driver: reboot needed: expected $expected, saw $seen"
  echo "reboot: scheduled"
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
    elif loaded nvidia && [[ "$(module_version)" != "${have%%-*}" || "$(module_kind)" != "$modules" ]]; then
      echo "reboot for the nvidia module ${have%%-*} ($modules)"
      return 0
    fi
  fi
  if [[ "$mode" != host ]] && [[ -n "$(host_driver_packages)" ]]; then
    echo "the host driver to remove (driver mode $mode)"
  elif ! kernel_args_active; then
    echo "kernel arguments ${kernel_args[*]}"
  elif loaded nouveau; then
    echo "nouveau to unload"
  elif [[ "$mode" == vfio ]] && ! all_bound vfio-pci; then
    echo "GPUs to vfio-pci"
  elif [[ "$mode" != vfio ]] && vfio_left_bound; then
    echo "GPUs off vfio-pci"
  elif marker reboot.pending && [[ "$(cut -d' ' -f1 "$ROOT$STATE_DIR/reboot.pending")" == "$(boot_id)" ]]; then
    echo "a reboot still due" # scheduled in this boot and not happened yet
  else
    return 1
  fi
}

main() {
  local why reason
  guest_begin
  driver_anchor
  if ((purge)); then
    [[ "$mode" == host ]] && purge_driver
    return 0
  fi
  # Local checks first: an unchanged node never asks the API server anything.
  if why="$(change_pending)" && rollout_joined; then
    rollout_begin "$why"
  fi
  blacklist_nouveau
  configure_vfio
  regenerate_initramfs
  configure_kernel_args
  case "$mode" in
  host)
    install_driver
    follow_kernel_updates
    ;;
  vfio)
    remove_host_driver
    echo "driver: none; GPUs bound to vfio-pci for KubeVirt"
    ;;
  *)
    remove_host_driver
    echo "driver: left to the GPU Operator"
    ;;
  esac
  if reason="$(reboot_reason)"; then
    schedule_reboot "$reason"
  else
    unmark reboot.pending
    ((blacklist_changed)) && echo "blacklist: nouveau blacklisted; not loaded, no reboot needed"
    [[ -f "$ROOT/etc/kubernetes/kubelet.conf" ]] || mig_mode_apply # joined: the MIG step, in its slot
    echo "reboot: not-needed"
  fi
}

main "$@" </dev/null
