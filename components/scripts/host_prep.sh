#!/usr/bin/env bash
# Prepare a Proxmox VE node for GPU passthrough: the IOMMU (kernel arguments only where the running kernel needs
# them), vfio-pci for exactly the PCI functions of the GPUs its owners declare (by address), the host driver
# blacklist only where every card of that driver is passed through.
# Usage: host_prep.sh --owner <id> --cpu-vendor intel|amd --boot-loader grub|systemd-boot|auto --acs-override 0|1
#   --reboot-policy when-idle|always|never [--iommu-pt 0|1] --gpu <domain:bus:device>=<vendor:device> [--gpu ...]
#   host_prep.sh --owner <id> --release
#
# Several owners (stacks, or clusters of one program; <id> is the caller's scope token, [a-z0-9][a-z0-9-]{0,62})
# may share the node: each run first records its owner's declaration in
# /etc/proxmox-gpu-cluster/host-prep.d/<id>.conf, then writes every host-wide file from the union of all drop-ins
# (host_compose.sh): vfio-pci takes every owner's GPUs, a kernel argument any owner wants is added, the blacklist
# follows the union. A drop-in is data, one item a line (empty and '#' lines are skipped; anything else fails naming it):
#   gpu <domain:bus:device>=<vendor:device>   one line per GPU, at least one (lower-case hex)
#   iommu-pt 0|1                             once: whether iommu=pt is wanted
#   acs-override 0|1                         once: whether pcie_acs_override=downstream,multifunction is wanted
# The same slot declared by two owners is shared when their vendor:device agree and refused, naming both, when not.
# CPU vendor, boot loader and reboot policy are this run's (facts and policy of the node, not claims). --release
# removes the owner's drop-in only (see main).
# Every path is under $PGC_ROOT (empty on a real host) so tests can run against a fake root.
#
# The IOMMU is decided from what runs, never from words on the command line: it is active when
# /sys/kernel/iommu_groups is populated. AMD's IOMMU driver is on by default (kernel-parameters.txt: amd_iommu=
# takes off, fullflush, force_isolation, force_enable, pgtbl_v1/v2: "on" is not a value, so amd_iommu=on is never
# written and an old one is removed); Intel's follows CONFIG_INTEL_IOMMU_DEFAULT_ON (drivers/iommu/intel/iommu.c:
# dmar_disabled = !IS_ENABLED(CONFIG_INTEL_IOMMU_DEFAULT_ON)), which Proxmox's kernels set from 6.8 (Proxmox VE
# 8.2+ and 9; pve-docs qm-pci-passthrough, "IOMMU": "With recent kernels (6.8 or newer), this is also true for
# Intel CPUs"). So intel_iommu=on is added on Intel only when the running kernel has its IOMMU off (or on thanks to
# it, before 6.8); iommu=pt only with --iommu-pt 1 (pve-docs: optional, "might increase performance").
#
# GPUs are bound by PCI address, never by vendor:device id (options vfio-pci ids= takes every card of the model, a
# console GPU too): vfio.conf gives vfio-pci an install command that writes driver_override for exactly the declared
# functions, then inserts vfio-pci; softdeps load vfio-pci before each host driver (nouveau, nvidia, snd_hda_intel).
# libkmod (modprobe, udev, systemd-modules-load) loads a softdep's pre modules first, running their install commands
# (libkmod-module.c __kmod_module_fill_softdep: only a module that HAS softdeps skips its own), so the overrides are
# set before any host driver registers, and a device with driver_override only matches the driver of that name
# (Documentation/ABI/testing/sysfs-bus-pci, driver_override; drivers/pci/pci-driver.c pci_match_device).
#
# Converges from any state: it compares what is wanted with what it observes, never with what this run changed:
# the files (rewritten atomically when they differ); the boot configuration GENERATED from them (plain GRUB: the
# default entry of /boot/grub/grub.cfg; on proxmox-boot-tool's ESPs, which are not mounted, what its last successful
# refresh generated from, recorded here: /etc/kernel/cmdline for systemd-boot, GRUB's configured line for GRUB; the
# boot loader as proxmox-boot-tool status reports it, host_compose.sh detect_boot_loader); the initramfs (a fingerprint of the module files
# the last successful update-initramfs packed, a "pending" marker written before each regeneration); the running
# /proc/cmdline and IOMMU; the live vfio-pci bindings. Only a wanted kernel argument the running kernel lacks (or a
# GPU that will not unbind) needs a reboot; with the IOMMU active, declared GPUs are bound at runtime, and other
# file changes (amd_iommu=on removed, ids= become driver_override) take effect at the next boot, whenever it is.
# The reboot follows --reboot-policy: when-idle only with no VM or container running (else the step fails naming
# them), always anyway, never: "reboot: required" and left to you. A scheduled reboot is recorded with its boot id:
# a node that came back (new boot id) without what the reboot was for fails the step instead of rebooting again.
# Prints "changed: <file>" per rewritten file ("... (removed)" per removed one), "vfio: ..." per runtime binding,
# then "reboot: scheduled", "reboot: required" or "reboot: not-needed". Failures: one line "host-prep: <what>:
# expected <x>, saw <y>" (a tool's own output below it), exit 1.
set -euo pipefail

ROOT="${PGC_ROOT:-}"
MARKER="$ROOT/run/proxmox-gpu-cluster/reboot-required"
SCHEDULED="$STATE/reboot-scheduled"
# shellcheck disable=SC2034 # read by host_lib.sh (failure lines, the ERR trap)
STEP="host-prep"
cpu_vendor="" boot_loader="auto" acs_override=0 reboot_policy="when-idle" iommu_pt=0 gpus=() changed=()
owner="" releasing=0 esp_sync=0 # esp_sync: see host_compose.sh

while (($#)); do
  case "$1" in
  --release) releasing=1 && shift && continue ;;
  --owner) owner="${2:-}" ;;
  --cpu-vendor) cpu_vendor="$2" ;;
  --boot-loader) boot_loader="$2" ;;
  --acs-override) acs_override="$2" ;;
  --reboot-policy) reboot_policy="$2" ;;
  --iommu-pt) iommu_pt="$2" ;;
  --gpu) gpus+=("$2") ;;
  *) fail arguments "a known argument" "$1" ;;
  esac
  shift 2
done

[[ "$owner" =~ $OWNER_RE ]] || fail arguments "--owner like $OWNER_RE" "'$owner'"
if ((!releasing)); then
  case "$cpu_vendor" in
  intel | amd) ;;
  *) fail arguments "--cpu-vendor intel or amd" "'$cpu_vendor'" ;;
  esac
  case "$reboot_policy" in
  when-idle | always | never) ;;
  *) fail arguments "--reboot-policy when-idle, always or never" "'$reboot_policy'" ;;
  esac
  [[ "$iommu_pt" == [01] ]] || fail arguments "--iommu-pt 0 or 1" "'$iommu_pt'"
  [[ "$acs_override" == [01] ]] || fail arguments "--acs-override 0 or 1" "'$acs_override'"
  [[ ${#gpus[@]} -gt 0 ]] || fail arguments "at least one --gpu" "none"
  for gpu in "${gpus[@]}"; do
    [[ "$gpu" =~ $GPU_RE ]] || fail arguments "--gpu <domain:bus:device>=<vendor:device> (lower-case hex)" "'$gpu'"
  done
fi

# initramfs_fingerprint: of the module files this step manages (which exist, and what they hold), as the initramfs
# should pack them.
initramfs_fingerprint() {
  local file
  for file in "${initramfs_files[@]}"; do
    [[ ! -f "$file" ]] || { echo "### ${file#"$ROOT"}" && cat "$file"; }
  done | sha256sum | cut -d' ' -f1
}

# iommu_active: whether the running kernel has an IOMMU: the IOMMU driver creates /sys/kernel/iommu_groups/<n>
# at boot, and only when it is on (pve-docs qm-pci-passthrough checks isolation there).
iommu_active() {
  compgen -G "$ROOT/sys/kernel/iommu_groups/*" >/dev/null
}

# intel_default_on <release>: whether a kernel of this release turns VT-d on without intel_iommu=on: Proxmox's
# kernels from 6.8 set CONFIG_INTEL_IOMMU_DEFAULT_ON (pve-docs qm-pci-passthrough, "IOMMU").
intel_default_on() {
  local major minor
  IFS=.- read -r major minor _ <<<"$1" || true
  [[ "$major" =~ ^[0-9]+$ && "$minor" =~ ^[0-9]+$ ]] ||
    fail kernel "a release like 6.8.12-4-pve in /proc/sys/kernel/osrelease" "'$1'"
  ((major > 6 || (major == 6 && minor >= 8)))
}

# bound_driver <sysfs device>: the driver bound to it, or nothing.
bound_driver() {
  if [[ -L "$1/driver" ]]; then basename "$(readlink "$1/driver")"; fi
}

# sysfs_write <value> <file>: bounded (an unbind can hang on a busy device). --foreground keeps tee in the step's
# process group, so whatever ends the step (a dropped SSH session) ends the write too.
sysfs_write() {
  printf '%s' "$1" | timeout --foreground 30 tee "$2" >/dev/null 2>&1
}

# bind_vfio <function address>: hand one PCI function to vfio-pci now (driver_override, unbind, probe). Each write
# is decided from the live binding, so a binding cut short anywhere is finished by the next run.
bind_vfio() {
  local dev="$ROOT/sys/bus/pci/devices/$1" current
  current="$(bound_driver "$dev")"
  [[ "$current" == vfio-pci ]] && return 0
  [[ "$(cat "$dev/driver_override" 2>/dev/null || true)" == vfio-pci ]] ||
    sysfs_write vfio-pci "$dev/driver_override" || return 1
  [[ -z "$current" ]] || sysfs_write "$1" "$dev/driver/unbind" || return 1
  sysfs_write "$1" "$ROOT/sys/bus/pci/drivers_probe" || true # the probe's status is what the link shows
  [[ "$(bound_driver "$dev")" == vfio-pci ]] || return 1
  echo "vfio: $1 bound to vfio-pci (was ${current:-unbound})"
}

# running_guests: "VM <id> (<name>), CT <id> (<name>)" for every running guest on this node, ours or not;
# fails when the lists cannot be read.
running_guests() {
  local vms cts=""
  vms="$(qm list)" || return 1
  ! command -v pct >/dev/null || cts="$(pct list)" || return 1
  {
    awk 'NR > 1 && $3 == "running" { print "VM " $1 " (" $2 ")" }' <<<"$vms"
    # pct list's Lock column may be empty: the name is the last field.
    awk 'NR > 1 && $2 == "running" { print "CT " $1 " (" $NF ")" }' <<<"$cts"
  } | paste -sd, - | sed 's/,/, /g'
}

main() {
  local current merged boot_file boot_content refresh_boot=() functions=() fn others=() # compose_functions sets both
  local file running boot_id unbound=() reason guests="" generated release iommu=0
  local scheduled_boot="" scheduled_reason="" scheduled_config=""
  local -a missing=() initramfs_files
  local -A content=()
  host_lock host-prep # host_lib.sh
  # put_file's temporary files a killed run left (a file no later run writes again, such as a reboot record or a
  # released owner's drop-in, would keep its own forever).
  sweep_leftovers "$STATE" "${MARKER%/*}" "$CLAIMS" "$ROOT/etc/default" "$ROOT/etc/kernel" "$ROOT/etc/modprobe.d" \
    "$ROOT/etc/modules-load.d"
  if ((releasing)); then
    # Only the owner's drop-in goes: the host-wide files keep its GPUs until the next host prep of any remaining
    # owner writes them from the union without it. Nothing is unbound and nothing reboots now (its GPUs stay on
    # vfio-pci until the next boot after that rewrite; with no owner left, the files stay as they are).
    drop "$CLAIMS/$owner.conf"
    for file in ${changed[@]+"${changed[@]}"}; do
      echo "changed: $file"
    done
    echo "released: owner $owner (the next host prep of another owner composes this node's files without it)"
    return 0
  fi
  # The union of every owner's claims with this run's own as it is about to be recorded; the kernel arguments any
  # owner wants (host_compose.sh).
  compose_claims "$owner" "$(declaration "$owner" "$iommu_pt" "$acs_override" "${gpus[@]}")"
  detect_boot_loader # host_compose.sh: boot_loader, esp_sync

  # intel_iommu=on only where the running kernel needs it: its IOMMU is off (before 6.8, intel_iommu=off, a kernel
  # without CONFIG_INTEL_IOMMU_DEFAULT_ON), or it is on thanks to the argument on a kernel before 6.8 (kept in the
  # boot configuration for the next boot). Never removed once there: it is valid and harmless.
  release="$(cat "$ROOT/proc/sys/kernel/osrelease")"
  ! iommu_active || iommu=1
  if [[ "$cpu_vendor" == intel ]] && { ((!iommu)) || { ! intel_default_on "$release" &&
    [[ " $(cat "$ROOT/proc/cmdline") " == *" intel_iommu=on "* ]]; }; }; then
    wanted_args=("intel_iommu=on" ${wanted_args[@]+"${wanted_args[@]}"})
  fi

  case "$boot_loader" in
  grub)
    boot_file="$ROOT/etc/default/grub"
    [[ -f "$boot_file" ]] || fail kernel-args "${boot_file#"$ROOT"}" "no such file"
    current="$(sed -n 's/^GRUB_CMDLINE_LINUX_DEFAULT="\(.*\)"$/\1/p' "$boot_file" | tail -n 1)"
    merged="$(merge_args "$current")"
    if grep -q '^GRUB_CMDLINE_LINUX_DEFAULT=' "$boot_file"; then
      boot_content="$(awk -v line="GRUB_CMDLINE_LINUX_DEFAULT=\"$merged\"" \
        '/^GRUB_CMDLINE_LINUX_DEFAULT=/ { if (!done) print line; done = 1; next } { print }' "$boot_file")"
    else
      boot_content="$(cat "$boot_file")"$'\n'"GRUB_CMDLINE_LINUX_DEFAULT=\"$merged\""
    fi
    refresh_boot=(update-grub)
    ((!esp_sync)) || refresh_boot=(proxmox-boot-tool refresh)
    ;;
  systemd-boot)
    boot_file="$ROOT/etc/kernel/cmdline"
    [[ -f "$boot_file" ]] || fail kernel-args "${boot_file#"$ROOT"}" "no such file"
    boot_content="$(merge_args "$(head -n 1 "$boot_file")")"
    refresh_boot=(proxmox-boot-tool refresh)
    ;;
  *) fail arguments "--boot-loader grub, systemd-boot or auto" "'$boot_loader'" ;;
  esac

  compose_functions
  # Recorded before any host-wide file changes: a run cut off later leaves the claim the next run of any owner
  # composes (and a refused declaration is never recorded).
  put "$CLAIMS/$owner.conf" "$(declaration "$owner" "$iommu_pt" "$acs_override" "${gpus[@]}")"

  # vfio_virqfd is not listed: it is built into vfio since kernel 6.2 (Proxmox VE 8).
  content["$ROOT/etc/modules-load.d/vfio.conf"]="# Managed by proxmox-gpu-cluster
vfio
vfio_iommu_type1
vfio_pci"
  if ((${#others[@]} == 0)); then
    content["$ROOT/etc/modprobe.d/blacklist-gpu-passthrough.conf"]="# Managed by proxmox-gpu-cluster: every NVIDIA \
GPU of this node is passed through, host drivers must not load
blacklist nouveau
blacklist nvidia
blacklist nvidiafb
blacklist nvidia_drm"
  fi
  # By address: whenever modprobe loads vfio-pci (a softdep of each host driver, or modules-load.d) this install
  # command sets driver_override on exactly these functions (a card removed is skipped), then inserts vfio-pci,
  # which binds them; the host drivers, loaded after it, match every other device. No ids=: every card of a model.
  content["$ROOT/etc/modprobe.d/vfio.conf"]="# Managed by proxmox-gpu-cluster: vfio-pci takes exactly these PCI functions \
(driver_override), the host drivers everything else
install vfio-pci for f in ${functions[*]}; do [ ! -e /sys/bus/pci/devices/\$f/driver_override ] || echo vfio-pci \
> /sys/bus/pci/devices/\$f/driver_override; done; modprobe --ignore-install vfio-pci \$CMDLINE_OPTS
softdep nouveau pre: vfio-pci
softdep nvidia pre: vfio-pci
softdep nvidiafb pre: vfio-pci
softdep nvidia_drm pre: vfio-pci
softdep snd_hda_intel pre: vfio-pci"
  # The same modules packed into the initramfs and loaded there, before udev loads a host GPU driver the initramfs
  # may hold: /etc/initramfs-tools/modules (initramfs-tools(7); with MODULES=list the only ones packed besides their
  # dependencies, initramfs.conf(5)). The node's own lines stay; this block is rewritten.
  content["$ROOT/etc/initramfs-tools/modules"]="$(with_vfio_modules "$ROOT/etc/initramfs-tools/modules")"
  initramfs_files=("$ROOT/etc/modules-load.d/vfio.conf" "$ROOT/etc/modprobe.d/blacklist-gpu-passthrough.conf"
    "$ROOT/etc/modprobe.d/vfio.conf" "$ROOT/etc/initramfs-tools/modules")

  # The pending markers go first, so a run cut off after a file changed redoes the regeneration it needs.
  ! differs "$boot_file" "$boot_content" || mark boot-loader
  for file in "${initramfs_files[@]}"; do
    if [[ -v "content[$file]" ]]; then
      ! differs "$file" "${content[$file]}" || mark initramfs
    elif [[ -e "$file" ]]; then
      mark initramfs
    fi
  done
  put "$boot_file" "$boot_content"
  for file in "${initramfs_files[@]}"; do
    if [[ -v "content[$file]" ]]; then put "$file" "${content[$file]}"; else drop "$file"; fi
  done
  for file in ${changed[@]+"${changed[@]}"}; do
    echo "changed: $file"
  done

  # Module and modprobe files take effect through the initramfs (on systemd-boot nodes Proxmox's initramfs hook
  # copies the new image to the ESPs): rebuilt when pending or when it was built from other files.
  if [[ -e "$STATE/initramfs-pending" ]] ||
    [[ "$(cat "$STATE/initramfs-generated" 2>/dev/null || true)" != "$(initramfs_fingerprint)" ]]; then
    regenerate initramfs update-initramfs -u -k all
    put_file "$STATE/initramfs-generated" "$(initramfs_fingerprint)"
    rm -f "$STATE/initramfs-pending"
  fi

  # Kernel arguments take effect through the boot loader's generated configuration.
  if [[ "$boot_loader" == grub ]] && ((esp_sync)); then
    # GRUB on the ESPs (proxmox-boot-tool): its grub.cfg is there, not mounted; what the last successful refresh
    # generated from is recorded. A drop-in that overrides the arguments fails before anything reboots.
    generated="$(grub_configured)"
    has_args "$generated" || fail boot-config "${missing[*]} in the kernel command line /etc/default/grub and \
/etc/default/grub.d/*.cfg give GRUB" "'$generated' (does a file in /etc/default/grub.d set GRUB_CMDLINE_LINUX_DEFAULT?)"
    if [[ -e "$STATE/boot-loader-pending" ]] ||
      [[ "$(cat "$STATE/grub-cmdline-refreshed" 2>/dev/null || true)" != "$generated" ]]; then
      regenerate boot-loader proxmox-boot-tool refresh
      put_file "$STATE/grub-cmdline-refreshed" "$generated"
      rm -f "$STATE/boot-loader-pending"
    fi
  elif [[ "$boot_loader" == grub ]]; then
    if [[ -e "$STATE/boot-loader-pending" ]] || ! has_args "$(grub_generated)"; then
      regenerate boot-loader update-grub
      generated="$(grub_generated)"
      # A file in /etc/default/grub.d may set the variable again: then no reboot could ever help.
      has_args "$generated" || fail boot-config "${missing[*]} in the first linux line of /boot/grub/grub.cfg after \
update-grub" "'$generated' (does a file in /etc/default/grub.d set GRUB_CMDLINE_LINUX_DEFAULT?)"
      rm -f "$STATE/boot-loader-pending"
    fi
  elif [[ -e "$STATE/boot-loader-pending" ]] ||
    [[ "$(cat "$STATE/kernel-cmdline-refreshed" 2>/dev/null || true)" != "$(cat "$boot_file")" ]]; then
    regenerate boot-loader proxmox-boot-tool refresh
    put_file "$STATE/kernel-cmdline-refreshed" "$(cat "$boot_file")"
    rm -f "$STATE/boot-loader-pending"
  fi

  # A reboot is due only when the running kernel lacks an argument, or a GPU cannot be bound at runtime.
  running="$(cat "$ROOT/proc/cmdline")"
  boot_id="$(cat "$ROOT/proc/sys/kernel/random/boot_id" 2>/dev/null || true)"
  if has_args "$running"; then
    # Nothing a reboot could add: an IOMMU still off is the firmware's (or an *iommu=off the spec does not manage).
    ((iommu)) || fail iommu "an active IOMMU (entries in /sys/kernel/iommu_groups) on kernel $release with \
'$running'" "none; turn on VT-d (Intel) or the IOMMU/AMD-Vi (AMD) in the firmware setup, and remove any \
intel_iommu=off, amd_iommu=off or iommu=off from the kernel command line"
    # The IOMMU is on: declared GPUs go to vfio-pci now instead of at the next boot.
    [[ -d "$ROOT/sys/module/vfio_pci" ]] || modprobe vfio-pci || fail vfio "modprobe vfio-pci to exit 0" "a failure"
    # One retry: a write cut short (a transient error, a probe racing udev) is not yet "will not unbind".
    for fn in "${functions[@]}"; do
      bind_vfio "$fn" || bind_vfio "$fn" || unbound+=("$fn")
    done
  fi
  if ((${#missing[@]})); then
    reason="the running kernel lacks ${missing[*]}"
  elif ((${#unbound[@]})); then
    reason="${unbound[*]} could not be bound to vfio-pci at runtime"
  else
    rm -f "$MARKER" "$SCHEDULED"
    echo "reboot: not-needed"
    return 0
  fi

  # A reboot this step scheduled for this reason in another boot did not bring what it was for: with the same
  # generated boot configuration, another would bring the same (a different one, say the cause was fixed, may).
  generated="$boot_loader: $(grub_generated)"
  [[ "$boot_loader" == grub ]] || generated="$boot_loader: $(cat "$STATE/kernel-cmdline-refreshed")"
  [[ "$boot_loader" != grub ]] || ((!esp_sync)) || generated="grub on the ESPs: $(cat "$STATE/grub-cmdline-refreshed")"
  if [[ -f "$SCHEDULED" ]]; then
    { read -r scheduled_boot scheduled_reason && read -r scheduled_config; } <"$SCHEDULED" || true
  fi
  if [[ -n "$scheduled_boot" && "$scheduled_boot" != "$boot_id" && "$scheduled_reason" == "$reason" &&
    "$scheduled_config" == "$generated" ]]; then
    if ((${#missing[@]})); then
      fail reboot "${missing[*]} in /proc/cmdline after the reboot host prep scheduled (boot $scheduled_boot)" \
        "'$running'; not rebooting again: the node booted something other than what ${refresh_boot[*]} generated \
(is --boot-loader $boot_loader the one it boots with?); fix that and reboot it yourself, or delete \
${SCHEDULED#"$ROOT"} to let host prep reboot it again"
    fi
    fail reboot "${unbound[*]} bound to vfio-pci after the reboot host prep scheduled (boot $scheduled_boot)" \
      "them unbound; not rebooting again: check what claims them, reboot it yourself or delete ${SCHEDULED#"$ROOT"}"
  fi

  put_file "$MARKER" "$reason"
  if [[ "$reboot_policy" == never ]]; then
    echo "reboot: required ($reason; rebootPolicy never: reboot the node yourself, then run pulumi up again)"
    return 0
  fi
  if ! guests="$(running_guests)"; then
    [[ "$reboot_policy" == always ]] ||
      fail reboot "the node's guests listed before rebooting it ($reason)" "qm list failing; not rebooting"
    guests="unknown (qm list failed)"
  fi
  if [[ "$reboot_policy" == when-idle && -n "$guests" ]]; then
    fail reboot "no running guests before rebooting the node ($reason)" "$guests; stop them, or set rebootPolicy: \
always (or never, and reboot it yourself). The configuration is written; the next run continues from here"
  fi
  # Recorded before it is scheduled: a run cut off in between finds the same boot id and schedules it again.
  put_file "$SCHEDULED" "$boot_id $reason"$'\n'"$generated"
  # Reboot a few seconds after this command returns, so the SSH session ends cleanly first.
  systemd-run --on-active=5 systemctl reboot >&2
  echo "reboot: scheduled ($reason${guests:+; running guests go down with it: $guests})"
}

main "$@" </dev/null
