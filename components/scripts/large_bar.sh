#!/usr/bin/env bash
# Give a VM's OVMF a 64 GiB 64-bit MMIO window so large-BAR GPUs (A100/H100 class) map: QEMU's
# -fw_cfg name=opt/ovmf/X-PciMmio64Mb. Runs on the Proxmox host because `args` is root-only in the API
# (token-authenticated users cannot set it). Idempotent: nothing happens when the VM already has the args;
# otherwise they are set and a running VM is restarted once so QEMU starts with them.
#
# Usage: large_bar.sh <vmid> <mmio-mb>
set -euo pipefail

vmid="$1"
mmio_mb="$2"
wanted="-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=${mmio_mb}"

if [[ "$(id -u)" != 0 ]]; then
  echo "large-bar: qm set --args needs root on this node; set proxmox.sshUser to root or use authMode: password" >&2
  exit 1
fi

current="$(qm config "$vmid" | sed -n 's/^args: //p')"
if [[ "$current" == "$wanted" ]]; then
  echo "large-bar: unchanged"
  exit 0
fi
qm set "$vmid" --args "$wanted"
if qm status "$vmid" | grep -q 'status: running'; then
  qm shutdown "$vmid" --timeout 180 || qm stop "$vmid"
  qm start "$vmid"
  echo "large-bar: set and restarted"
else
  echo "large-bar: set"
fi
