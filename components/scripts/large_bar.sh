#!/usr/bin/env bash
# Give a VM's OVMF a 64 GiB 64-bit MMIO window so large-BAR GPUs (A100/H100 class) map: QEMU's
# -fw_cfg name=opt/ovmf/X-PciMmio64Mb. Runs on the Proxmox host because `args` is root-only in the API
# (token-authenticated users cannot set it).
#
# A new worker VM is created stopped, so it gets the window before its first start and boots once: the args are
# set, then the VM is started. Idempotent: nothing happens to a running VM that has the args. A running VM
# without them (someone removed them) is restarted once so QEMU starts with them.
# With --address (a DHCP worker), waits until the guest agent reports an IPv4 address and prints "address: IP".
#
# Usage: large_bar.sh <vmid> <mmio-mb> [--address]
set -euo pipefail

vmid="$1"
mmio_mb="$2"
want_address="${3:-}"
wanted="-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=${mmio_mb}"
[[ "$vmid" =~ ^[0-9]{3,9}$ ]] || { echo "large-bar: vmid: expected a number, seen '$vmid'" >&2; exit 1; }
[[ "$mmio_mb" =~ ^[0-9]{1,7}$ ]] || { echo "large-bar: mmio: expected MiB, seen '$mmio_mb'" >&2; exit 1; }
[[ -z "$want_address" || "$want_address" == --address ]] ||
  { echo "large-bar: expected --address or nothing, seen '$want_address'" >&2; exit 1; }

if [[ "$(id -u)" != 0 ]]; then
  echo "large-bar: qm set --args needs root on this node; set proxmox.sshUser to root or use authMode: password" >&2
  exit 1
fi

running() {
  qm status "$vmid" | grep -q 'status: running'
}

# guest_address: the first non-loopback IPv4 address the guest agent reports, nothing while it does not answer.
guest_address() {
  qm guest cmd "$vmid" network-get-interfaces 2>/dev/null | perl -MJSON::PP -e '
    my $ifaces = eval { decode_json(join("", <STDIN>)) } || [];
    for my $if (@$ifaces) {
      for my $a (@{ $if->{"ip-addresses"} || [] }) {
        if ($a->{"ip-address-type"} eq "ipv4" && $a->{"ip-address"} !~ /^127\./) { print $a->{"ip-address"}; exit 0 }
      }
    }' || true
}

main() {
  local current address waited=0
  current="$(qm config "$vmid" | sed -n 's/^args: //p')"
  if [[ "$current" != "$wanted" ]]; then
    qm set "$vmid" --args "$wanted"
    if running; then
      qm shutdown "$vmid" --timeout 180 || qm stop "$vmid"
      qm start "$vmid"
      echo "large-bar: set and restarted"
    else
      qm start "$vmid"
      echo "large-bar: set; first start"
    fi
  elif ! running; then
    qm start "$vmid"
    echo "large-bar: unchanged; started"
  else
    echo "large-bar: unchanged"
  fi
  [[ -n "$want_address" ]] || return 0
  until address="$(guest_address)" && [[ -n "$address" ]]; do
    if ((waited >= 600)); then
      echo "large-bar: guest agent of VM $vmid: expected an IPv4 address within 600s, seen none" >&2
      exit 1
    fi
    sleep 5
    waited=$((waited + 5))
  done
  echo "address: $address"
}

main "$@" </dev/null
