#!/usr/bin/env bash
# Prepare a Proxmox VE node for GPU passthrough: IOMMU kernel arguments, vfio modules, host driver blacklist,
# vfio-pci device ids. Idempotent: files are rewritten only when their content differs, and a reboot is
# scheduled only when a file changed or the running kernel lacks an argument this script configures.
#
# Usage: host_prep.sh --cpu-vendor intel|amd --boot-loader grub|systemd-boot|auto --acs-override 0|1
#                     --gpu <domain:bus:device>=<vendor:device> [--gpu ...]
# Every path is under $PGC_ROOT (empty on a real host) so tests can run against a fake root.
# Prints "changed: <file>" per rewritten file and finally "reboot: scheduled" or "reboot: not-needed".
set -euo pipefail

ROOT="${PGC_ROOT:-}"
cpu_vendor=""
boot_loader="auto"
acs_override=0
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
  --gpu) gpus+=("$2") ;;
  *) die arguments "unknown argument $1" ;;
  esac
  shift 2
done

case "$cpu_vendor" in
intel | amd) ;;
*) die arguments "--cpu-vendor must be intel or amd, got '$cpu_vendor'" ;;
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

# vendor:device of every function of every passthrough GPU (the GPU and e.g. its audio or USB-C functions).
ids=()
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
if ((${#changed[@]} > kernel_changes)); then
  update-initramfs -u -k all
fi
if ((kernel_changes)); then
  "${refresh_boot[@]}"
fi

# A reboot is due when a file changed, or when the running kernel still lacks an argument (a previous run
# changed the files but the node has not rebooted since).
reboot=${#changed[@]}
running="$(cat "$ROOT/proc/cmdline")"
for token in "${wanted_args[@]}"; do
  [[ " $running " == *" $token "* ]] || reboot=1
done

if ((reboot)); then
  # Reboot a few seconds after this command returns, so the SSH session ends cleanly first.
  systemd-run --on-active=5 systemctl reboot
  echo "reboot: scheduled"
else
  echo "reboot: not-needed"
fi
