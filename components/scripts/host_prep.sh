#!/usr/bin/env bash
# Prepare a Proxmox VE node for GPU passthrough: IOMMU kernel arguments, vfio modules, host driver blacklist,
# vfio-pci for the GPUs the node declares. Idempotent: files are rewritten only when their content differs.
#
# Usage: host_prep.sh --cpu-vendor intel|amd --boot-loader grub|systemd-boot|auto --acs-override 0|1
#                     --reboot-policy when-idle|always|never --gpu <domain:bus:device>=<vendor:device> [--gpu ...]
# Every path is under $PGC_ROOT (empty on a real host) so tests can run against a fake root.
#
# Reboots: only the kernel command line needs one. A GPU newly declared on a node that already runs with the
# IOMMU on is bound to vfio-pci at runtime (driver_override + probe); the files make later boots do the same. When
# the running kernel lacks an argument, the reboot follows --reboot-policy: when-idle reboots only if no VM or
# container runs on the node (otherwise the step fails naming them), always reboots anyway, never reports
# "reboot: required" and leaves it to you. Either way the files are written and the boot loader and initramfs are
# refreshed first, and an interrupted refresh is redone by the next run (markers under /var/lib).
# Prints "changed: <file>" per rewritten file, "vfio: ..." per runtime binding, and finally "reboot: scheduled",
# "reboot: required" or "reboot: not-needed".
set -euo pipefail

ROOT="${PGC_ROOT:-}"
STATE="$ROOT/var/lib/proxmox-gpu-cluster"
MARKER="$ROOT/run/proxmox-gpu-cluster/reboot-required"
cpu_vendor=""
boot_loader="auto"
acs_override=0
reboot_policy="when-idle"
gpus=()

die() {
  echo "host-prep: $1: $2" >&2
  exit 1
}

while (($#)); do
  case "$1" in
  --cpu-vendor) cpu_vendor="$2" ;;
  --boot-loader) boot_loader="$2" ;;
  --acs-override) acs_override="$2" ;;
  --reboot-policy) reboot_policy="$2" ;;
  --gpu) gpus+=("$2") ;;
  *) die arguments "unknown argument $1" ;;
  esac
  shift 2
done

case "$cpu_vendor" in
intel | amd) ;;
*) die arguments "--cpu-vendor must be intel or amd, got '$cpu_vendor'" ;;
esac
case "$reboot_policy" in
when-idle | always | never) ;;
*) die arguments "--reboot-policy must be when-idle, always or never, got '$reboot_policy'" ;;
esac
[[ ${#gpus[@]} -gt 0 ]] || die arguments "no --gpu given"

wanted_args=("${cpu_vendor}_iommu=on" "iommu=pt")
if [[ "$acs_override" == 1 ]]; then
  wanted_args+=("pcie_acs_override=downstream,multifunction")
fi

changed=()

# Write $2 to file $1 when it differs; remember the change.
put() {
  local file="$1" content="$2"
  if [[ -f "$file" ]] && [[ "$(cat "$file")" == "$content" ]]; then
    return 0
  fi
  mkdir -p "$(dirname "$file")"
  printf '%s\n' "$content" >"$file.pgc-tmp"
  mv "$file.pgc-tmp" "$file"
  changed+=("${file#"$ROOT"}")
}

# Merge the wanted arguments into a kernel command line: an argument with the same key is replaced,
# everything else is kept in order, nothing is duplicated.
merge_args() {
  local line="$1" token key out=() seen
  local -A wanted=()
  for token in "${wanted_args[@]}"; do
    wanted["${token%%=*}"]="$token"
  done
  read -r -a tokens <<<"$line"
  for token in "${tokens[@]}"; do
    key="${token%%=*}"
    if [[ -n "${wanted[$key]:-}" ]]; then
      continue
    fi
    out+=("$token")
  done
  for token in "${wanted_args[@]}"; do
    seen=0
    for key in "${out[@]}"; do
      [[ "$key" == "$token" ]] && seen=1
    done
    ((seen)) || out+=("$token")
  done
  echo "${out[*]}"
}

detect_boot_loader() {
  # proxmox-boot-tool keeps the ESP list in /etc/kernel/proxmox-boot-uuids; with /etc/kernel/cmdline present
  # the node boots with systemd-boot (ZFS root on UEFI), otherwise with GRUB (Proxmox VE admin guide, "Host
  # Bootloader").
  if [[ -f "$ROOT/etc/kernel/proxmox-boot-uuids" && -f "$ROOT/etc/kernel/cmdline" ]]; then
    echo systemd-boot
  else
    echo grub
  fi
}

# pending <name> <command...>: run a refresh that a file change made necessary. The marker is written before and
# removed after, so a run that fails (or is cut off) in between leaves it, and the next run redoes the refresh
# even though the files no longer change.
pending() {
  local name="$1"
  shift
  mkdir -p "$STATE"
  : >"$STATE/$name-pending"
  "$@"
  rm -f "$STATE/$name-pending"
}

# bound_driver <sysfs device>: the driver bound to it, or nothing.
bound_driver() {
  if [[ -L "$1/driver" ]]; then
    basename "$(readlink "$1/driver")"
  fi
}

# sysfs_write <value> <file>: bounded (an unbind can hang on a busy device).
sysfs_write() {
  printf '%s' "$1" | timeout 30 tee "$2" >/dev/null 2>&1
}

# bind_vfio <function address>: hand one PCI function to vfio-pci now (driver_override, unbind, probe).
bind_vfio() {
  local dev="$ROOT/sys/bus/pci/devices/$1" current
  current="$(bound_driver "$dev")"
  [[ "$current" == vfio-pci ]] && return 0
  sysfs_write vfio-pci "$dev/driver_override" || return 1
  if [[ -n "$current" ]]; then
    sysfs_write "$1" "$dev/driver/unbind" || return 1
  fi
  sysfs_write "$1" "$ROOT/sys/bus/pci/drivers_probe" || true # the probe's status is what the link shows
  [[ "$(bound_driver "$dev")" == vfio-pci ]] || return 1
  echo "vfio: $1 bound to vfio-pci (was ${current:-unbound})"
}

# running_guests: "VM <id> (<name>), CT <id> (<name>)" for every running guest on this node, ours or not;
# fails when the lists cannot be read.
running_guests() {
  local vms cts=""
  vms="$(qm list)" || return 1
  if command -v pct >/dev/null; then
    cts="$(pct list)" || return 1
  fi
  {
    awk 'NR > 1 && $3 == "running" { print "VM " $1 " (" $2 ")" }' <<<"$vms"
    # pct list's Lock column may be empty: the name is the last field.
    awk 'NR > 1 && $2 == "running" { print "CT " $1 " (" $NF ")" }' <<<"$cts"
  } | paste -sd, - | sed 's/,/, /g'
}

main() {
  local current merged new refresh_boot=() kernel_changes functions=() ids=() fn slot expected id found
  local grub cmdline id_list gpu file token
  if [[ "$boot_loader" == auto ]]; then
    boot_loader="$(detect_boot_loader)"
  fi

  case "$boot_loader" in
  grub)
    grub="$ROOT/etc/default/grub"
    [[ -f "$grub" ]] || die kernel-args "$grub not found"
    current="$(sed -n 's/^GRUB_CMDLINE_LINUX_DEFAULT="\(.*\)"$/\1/p' "$grub" | tail -n 1)"
    merged="$(merge_args "$current")"
    if grep -q '^GRUB_CMDLINE_LINUX_DEFAULT=' "$grub"; then
      new="$(awk -v line="GRUB_CMDLINE_LINUX_DEFAULT=\"$merged\"" \
        '/^GRUB_CMDLINE_LINUX_DEFAULT=/ { if (!done) print line; done = 1; next } { print }' "$grub")"
    else
      new="$(cat "$grub")"$'\n'"GRUB_CMDLINE_LINUX_DEFAULT=\"$merged\""
    fi
    put "$grub" "$new"
    refresh_boot=(update-grub)
    ;;
  systemd-boot)
    cmdline="$ROOT/etc/kernel/cmdline"
    [[ -f "$cmdline" ]] || die kernel-args "$cmdline not found"
    merged="$(merge_args "$(head -n 1 "$cmdline")")"
    put "$cmdline" "$merged"
    refresh_boot=(proxmox-boot-tool refresh)
    ;;
  *) die arguments "--boot-loader must be grub, systemd-boot or auto, got '$boot_loader'" ;;
  esac

  kernel_changes=${#changed[@]}

  # vfio_virqfd is not listed: it is built into vfio since kernel 6.2 (Proxmox VE 8).
  put "$ROOT/etc/modules-load.d/vfio.conf" "# Managed by proxmox-gpu-cluster
vfio
vfio_iommu_type1
vfio_pci"

  # vendor:device of every function of every declared GPU (the GPU and e.g. its audio or USB-C functions).
  for gpu in "${gpus[@]}"; do
    slot="${gpu%%=*}"
    expected="${gpu#*=}"
    found=0
    for fn in "$ROOT/sys/bus/pci/devices/$slot".*; do
      [[ -e "$fn/vendor" ]] || continue
      id="$(sed 's/^0x//' "$fn/vendor"):$(sed 's/^0x//' "$fn/device")"
      if [[ "${fn##*/}" == "$slot.0" ]]; then
        found=1
        [[ "$id" == "$expected" ]] || die vfio-ids "$slot.0 is $id, the spec expects $expected"
      fi
      ids+=("$id")
      functions+=("${fn##*/}")
    done
    ((found)) || die vfio-ids "no PCI device at $slot.0"
  done
  id_list="$(printf '%s\n' "${ids[@]}" | sort -u | paste -sd, -)"

  put "$ROOT/etc/modprobe.d/blacklist-gpu-passthrough.conf" "# Managed by proxmox-gpu-cluster: host drivers must not claim passthrough GPUs
blacklist nouveau
blacklist nvidia
blacklist nvidiafb
blacklist nvidia_drm"

  # softdep makes modprobe load vfio-pci before any GPU driver, so vfio-pci binds the ids first.
  put "$ROOT/etc/modprobe.d/vfio.conf" "# Managed by proxmox-gpu-cluster
options vfio-pci ids=$id_list
softdep nouveau pre: vfio-pci
softdep nvidia pre: vfio-pci
softdep nvidiafb pre: vfio-pci
softdep nvidia_drm pre: vfio-pci
softdep snd_hda_intel pre: vfio-pci"

  for file in "${changed[@]}"; do
    echo "changed: $file"
  done

  # Module and modprobe files take effect through the initramfs (on systemd-boot nodes Proxmox's initramfs
  # hook copies the new image to the ESPs); kernel arguments through the boot loader's own refresh.
  if ((${#changed[@]} > kernel_changes)) || [[ -e "$STATE/initramfs-pending" ]]; then
    pending initramfs update-initramfs -u -k all
  fi
  if ((kernel_changes)) || [[ -e "$STATE/boot-loader-pending" ]]; then
    pending boot-loader "${refresh_boot[@]}"
  fi

  # A reboot is due only when the running kernel lacks an argument (this or an earlier run changed them).
  local running missing=() unbound=() reason
  running="$(cat "$ROOT/proc/cmdline")"
  for token in "${wanted_args[@]}"; do
    [[ " $running " == *" $token "* ]] || missing+=("$token")
  done
  if ((${#missing[@]} == 0)); then
    # The IOMMU is on: newly declared GPUs go to vfio-pci now instead of at the next boot.
    [[ -d "$ROOT/sys/module/vfio_pci" ]] || modprobe vfio-pci || die vfio "modprobe vfio-pci failed"
    for fn in "${functions[@]}"; do
      bind_vfio "$fn" || unbound+=("$fn")
    done
  fi
  if ((${#missing[@]})); then
    reason="the running kernel lacks ${missing[*]}"
  elif ((${#unbound[@]})); then
    reason="${unbound[*]} could not be bound to vfio-pci at runtime"
  else
    rm -f "$MARKER"
    echo "reboot: not-needed"
    return 0
  fi

  mkdir -p "$(dirname "$MARKER")"
  printf '%s\n' "$reason" >"$MARKER"
  if [[ "$reboot_policy" == never ]]; then
    echo "reboot: required ($reason; rebootPolicy never: reboot the node yourself, then run pulumi up again)"
    return 0
  fi
  local guests=""
  if ! guests="$(running_guests)"; then
    [[ "$reboot_policy" == always ]] ||
      die reboot "the node needs a reboot ($reason), but its guests cannot be listed (qm list failed); not rebooting"
    guests="unknown (qm list failed)"
  fi
  case "$reboot_policy" in
  when-idle)
    [[ -z "$guests" ]] || die reboot "the node needs a reboot ($reason), but guests are running: $guests; stop \
them, or set rebootPolicy: always (or never, and reboot it yourself). The configuration is written; the next run \
continues from here"
    ;;
  esac
  # Reboot a few seconds after this command returns, so the SSH session ends cleanly first.
  systemd-run --on-active=5 systemctl reboot
  echo "reboot: scheduled ($reason${guests:+; running guests go down with it: $guests})"
}

main "$@" </dev/null
