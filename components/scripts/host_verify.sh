#!/usr/bin/env bash
# Verify a Proxmox VE node after GPU host preparation (and its reboot): IOMMU on (populated
# /sys/kernel/iommu_groups), interrupt remapping on, the kernel arguments the spec asks for (iommu=pt, the ACS
# override) active, every function of every passthrough GPU bound to vfio-pci, and each GPU's
# IOMMU group holding nothing but that GPU's functions and PCI bridges; with --nested 1 (the node hosts a KubeVirt
# worker, which runs VMs of its own), nested virtualization on in the kvm module.
#
# Usage: host_verify.sh --kernel-arg <arg> [...] --gpu <domain:bus:device> [--gpu ...] [--nested 0|1]
# Paths are under $PGC_ROOT (empty on a real host). On success prints "group <slot> <n>" per GPU; on failure
# prints "host-verify: <what>: expected <x>, saw <y>" to stderr and exits 1. It changes nothing, so it converges
# trivially; it waits for the node's step lock so it never reads a state host prep is in the middle of changing.
set -euo pipefail

ROOT="${PGC_ROOT:-}"
# shellcheck disable=SC2034 # read by host_lib.sh (failure lines, the ERR trap)
STEP="host-verify"
kernel_args=()
gpus=()
nested=0

while (($#)); do
  case "$1" in
  --kernel-arg) kernel_args+=("$2") ;;
  --gpu) gpus+=("$2") ;;
  --nested) nested="$2" ;;
  *) fail arguments "a known argument" "$1" ;;
  esac
  shift 2
done
# (( )) evaluates its operand as arithmetic, where an array index runs command substitutions: only 0 or 1 passes.
[[ "$nested" == [01] ]] || fail arguments "--nested 0 or 1" "'$nested'"

kernel_log() {
  # The ring buffer can have wrapped on a long-running host; the journal keeps this boot's messages.
  dmesg 2>/dev/null || true
  journalctl -k -b 0 --no-pager 2>/dev/null || true
}

# pending_reboot: "; <why>" when host prep waits for a reboot, or the one it scheduled came back without what it
# was for; nothing otherwise.
pending_reboot() {
  local scheduled=""
  # host_prep.sh leaves this marker (in /run: a reboot clears it) when it could not or may not reboot.
  if [[ -s "$ROOT/run/proxmox-gpu-cluster/reboot-required" ]]; then
    echo "; host prep is waiting for a reboot ($(head -n 1 "$ROOT/run/proxmox-gpu-cluster/reboot-required")):" \
      "reboot the node, then run pulumi up again"
  elif [[ -s "$ROOT/var/lib/proxmox-gpu-cluster/reboot-scheduled" ]]; then
    # host_prep.sh records the boot id it scheduled a reboot in: a different one now means it happened.
    read -r scheduled _ <"$ROOT/var/lib/proxmox-gpu-cluster/reboot-scheduled" || true
    if [[ "$scheduled" != "$(cat "$ROOT/proc/sys/kernel/random/boot_id" 2>/dev/null || true)" ]]; then
      echo "; the reboot host prep scheduled (in boot $scheduled) came back without it: the node boots something" \
        "other than the configuration host prep generated (is its bootLoader right?)"
    fi
  fi
}

# Every check runs from main with stdin closed: only the agent prologue reads stdin.
main() {
  host_lock host-verify # host_lib.sh
  running="$(cat "$ROOT/proc/cmdline")"
  pending="$(pending_reboot)"
  for arg in "${kernel_args[@]}"; do
    [[ " $running " == *" $arg "* ]] || fail kernel-args "$arg in /proc/cmdline" "$running$pending"
  done

  log="$(kernel_log)"
  # The IOMMU is what runs, not what the command line says (amd_iommu=on is no value; AMD's IOMMU and, from kernel
  # 6.8, Intel's are on without any argument): its driver creates the groups at boot, and only when it is on.
  if [[ -z "$(ls -A "$ROOT/sys/kernel/iommu_groups" 2>/dev/null)" ]]; then
    fail iommu "entries in /sys/kernel/iommu_groups (an active IOMMU)" "none (kernel log: $(grep -E 'DMAR|AMD-Vi' \
<<<"$log" | tail -n 1 || true))$pending"
  fi
  if ! grep -qE 'Enabled IRQ remapping|Interrupt remapping enabled' <<<"$log"; then
    fail interrupt-remapping "'Enabled IRQ remapping' (Intel) or 'Interrupt remapping enabled' (AMD)" \
      "no such kernel log line"
  fi

  if ((nested)); then
    value=""
    for module in kvm_intel kvm_amd; do
      if [[ -r "$ROOT/sys/module/$module/parameters/nested" ]]; then
        value="$(cat "$ROOT/sys/module/$module/parameters/nested")"
      fi
    done
    [[ "$value" == Y || "$value" == 1 ]] ||
      fail nested-virtualization "Y or 1 in /sys/module/kvm_{intel,amd}/parameters/nested (a KubeVirt worker runs VMs)" \
        "${value:-no kvm module}"
  fi

  for slot in "${gpus[@]}"; do
    functions=("$ROOT/sys/bus/pci/devices/$slot".*)
    [[ -e "${functions[0]}" ]] || fail devices "PCI device $slot.0" "nothing at that address"
    group=""
    for fn in "${functions[@]}"; do
      name="${fn##*/}"
      driver="none"
      if [[ -L "$fn/driver" ]]; then
        driver="$(basename "$(readlink "$fn/driver")")"
      fi
      [[ "$driver" == vfio-pci ]] || fail driver "$name bound to vfio-pci" "$driver"
      [[ -L "$fn/iommu_group" ]] || fail isolation "$name in an IOMMU group" "no iommu_group link"
      group="$(basename "$(readlink "$fn/iommu_group")")"
    done
    others=()
    for member in "$ROOT/sys/kernel/iommu_groups/$group/devices/"*; do
      name="${member##*/}"
      [[ "$name" == "$slot".* ]] && continue
      # PCI-to-PCI bridges (class 0x0604) may share the group: they are not handed to the VM.
      [[ "$(cat "$member/class")" == 0x0604* ]] && continue
      others+=("$name")
    done
    if ((${#others[@]})); then
      fail isolation "IOMMU group $group to hold only $slot and bridges (else set acsOverride or use another slot)" \
        "${others[*]}"
    fi
    echo "group $slot $group"
  done
}

main "$@" </dev/null
