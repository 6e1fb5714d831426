#!/usr/bin/env bash
# Give a VM's OVMF a 64 GiB 64-bit MMIO window so large-BAR GPUs (A100/H100 class) map: QEMU's
# -fw_cfg name=opt/ovmf/X-PciMmio64Mb. Runs on the Proxmox host because `args` is root-only in the API
# (token-authenticated users cannot set it).
#
# Converges from any state, deciding from what RUNS, not from the config alone: QEMU reads `args` only when it
# starts, so the window must be in the VM's config (qm config) and in the argv of its running kvm process
# (/proc/<pid>/cmdline, the pid from /var/run/qemu-server/<vmid>.pid). A new worker VM is created stopped, so it
# gets the window before its first start and boots once. A running VM whose kvm process lacks the window (someone
# removed the args, or a run was cut off between setting them and restarting the VM) is restarted once; it is
# never reported unchanged. A running VM that has it is left alone.
# With --address (a DHCP worker), waits until the guest agent reports an IPv4 address and prints "address: IP".
# Prints one "large-bar: ..." line saying what it did; failures print "large-bar: <what>: expected <x>, saw <y>".
#
# Usage: large_bar.sh <vmid> <mmio-mb> [--address]
set -euo pipefail

ROOT="${PGC_ROOT:-}"
# shellcheck disable=SC2034 # read by host_lib.sh (failure lines, the ERR trap)
STEP="large-bar"

vmid="${1:-}"
mmio_mb="${2:-}"
want_address="${3:-}"
wanted="-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=${mmio_mb}"
[[ "$vmid" =~ ^[0-9]{3,9}$ ]] || fail vmid "a number" "'$vmid'"
[[ "$mmio_mb" =~ ^[0-9]{1,7}$ ]] || fail mmio "MiB" "'$mmio_mb'"
[[ -z "$want_address" || "$want_address" == --address ]] || fail arguments "--address or nothing" "'$want_address'"

uid="$(id -u)"
[[ "$uid" == 0 ]] || fail user "root (qm set --args is root-only)" "uid $uid; set proxmox.sshUser to root or use \
authMode: password"

running() {
  local status
  status="$(qm status "$vmid" 2>&1)" || fail status "qm status $vmid to answer" "'$status'"
  [[ "$status" == *"status: running"* ]]
}

# running_args: the argv of the VM's kvm process, space-separated; nothing when there is none.
running_args() {
  local pid
  pid="$(cat "$ROOT/var/run/qemu-server/$vmid.pid" 2>/dev/null)" || return 0
  [[ "$pid" =~ ^[0-9]+$ && -r "$ROOT/proc/$pid/cmdline" ]] || return 0
  tr '\0' ' ' <"$ROOT/proc/$pid/cmdline"
}

has_window() {
  [[ " $(running_args) " == *" $wanted "* ]]
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
  local config current address waited=0 set=0 did
  # Every qm that may start a VM gets fd 9 (this lock) closed, or the VM's QEMU process would hold it as long as
  # it runs.
  host_lock "large-bar $vmid" # host_lib.sh
  config="$(qm config "$vmid" 2>&1)" || fail config "the config of VM $vmid (qm config)" "'$config'"
  current="$(sed -n 's/^args: //p' <<<"$config")"
  if [[ "$current" != "$wanted" ]]; then
    qm set "$vmid" --args "$wanted" >&2
    set=1
  fi
  if running && has_window; then
    did="unchanged"
    if ((set)); then did="set (it already runs with it)"; fi
  elif running; then
    qm shutdown "$vmid" --timeout 180 9>&- >&2 || qm stop "$vmid" 9>&- >&2
    qm start "$vmid" 9>&- >&2
    did="restarted (it ran without the MMIO window)"
    if ((set)); then did="set and restarted"; fi
  else
    qm start "$vmid" 9>&- >&2
    did="unchanged; started"
    if ((set)); then did="set; first start"; fi
  fi
  has_window || fail mmio-window "'$wanted' in the argv of VM $vmid's kvm process" "'$(running_args)'"
  echo "large-bar: $did"
  [[ -n "$want_address" ]] || return 0
  exec 9>&- # waiting for the guest agent changes nothing: the other steps on this node may go on
  until address="$(guest_address)" && [[ -n "$address" ]]; do
    if ((waited >= 600)); then
      fail address "an IPv4 address from the guest agent of VM $vmid within 600s" "none"
    fi
    sleep 5
    waited=$((waited + 5))
  done
  echo "address: $address"
}

main "$@" </dev/null
