#!/usr/bin/env bash
# Apply a worker VM's pending hardware (cores, memory, GPUs, network: what the provider writes into the VM's
# configuration and leaves pending, reboot_after_update false) by stopping and starting the VM from its Proxmox node,
# with its Kubernetes node held first. Runs on the VM's Proxmox node as root, after the VM's update and before the
# guest's bootstrap steps; the guest's verify step then checks the new hardware, uncordons the node and gives its
# slot back.
#
# Why a stop and a start: Proxmox applies pending changes only to a new QEMU process ("qm reboot ... Applies pending
# changes", qemu-server; a reboot inside the guest keeps the same process). Decided from what Proxmox reports now:
# `qm pending <vmid>` prints "new <key>: <value>" and "del <key>: <value>" lines for changes not applied yet, "cur"
# for the rest (pve-guest-common PVE/GuestHelpers.pm, format_pending). Nothing pending: nothing to do, so a first
# provisioning and a further run change nothing. Pending: the guest's installed hold step (through the QEMU guest
# agent) takes the node's rollout slot, cordons and drains it (a node that has not joined yet takes nothing); then
# `qm shutdown`, `qm start`, and the pending changes must be gone. The marker $STATE/vm-restart-<vmid> ("stopping",
# then "started", written before each) lets a run that finds the VM stopped start it again.
# Sent after host_lib.sh and host_qm.sh.
#
# Usage: vm_restart.sh --vmid N --node-name NAME --timeout SECONDS --hardware KEY --guest-step PATH -- GUEST-ARGS...
# --hardware: the VM hardware the spec asks for, as a key (only so that a change of it runs the step again).
set -euo pipefail
# shellcheck disable=SC2034 # read by fail() in host_lib.sh
STEP="vm-restart"

vmid="" node_name="" timeout="" hardware="" guest_step="" guest_args=()
while (($#)); do
  case "$1" in
  --hardware) hardware="$2" ;;
  --)
    shift
    guest_args=("$@")
    break
    ;;
  *)
    qm_step_arg "$1" "${2-}" ||
      fail arguments "--vmid, --node-name, --timeout, --hardware, --guest-step, -- and the guest's arguments" "$1"
    ;;
  esac
  shift 2
done

# pending_keys: the configuration keys Proxmox has not applied to the running VM, comma-separated ("" for none).
pending_keys() {
  local out
  out="$(qm pending "$vmid" 2>&1)" || fail "qm pending $vmid" "the VM's configuration" "${out//$'\n'/ }"
  sed -n 's/^\(new\|del\) \([^:]*\):.*/\2/p' <<<"$out" | sort -u | paste -sd, -
}

main() {
  qm_step_checks "hold step" "qm"
  [[ "$hardware" =~ ^[0-9a-f]{8,64}$ ]] || fail "--hardware" "a hex key" "'$hardware'"
  QM_ERR_FILE="$(mktemp)"
  trap 'rm -f "$QM_ERR_FILE"' EXIT
  # One run of the hold step: the slot and the drain (qm_hold_seconds), and 60 s for the rest.
  local run_for
  qm_hold_seconds "${guest_args[@]}"
  run_for=$((QM_HOLD_SECONDS + 60))
  host_lock "vm-restart VM $vmid" # not while host prep, a large-BAR or MIG restart step changes this node or VM
  local marker="$STATE/vm-restart-$vmid" was="" status keys
  [[ ! -f "$marker" ]] || was="$(cat "$marker")"
  status="$(qm status "$vmid" 2>&1)" || fail "VM $vmid" "a VM on this node" "${status//$'\n'/ }"
  if [[ "$status" != *"status: running"* ]]; then
    # Stopped by this step (a run killed before its start): start it; stopped otherwise: not this step's to start.
    [[ -n "$was" ]] || fail "VM $vmid ($node_name)" "running" "${status//$'\n'/ }"
    put_file "$marker" started
    qm start "$vmid" 9>&- # QEMU outlives the step: it must not hold the node's lock
    was=started
  fi
  keys="$(pending_keys)"
  if [[ -z "$keys" ]]; then
    rm -f "$marker"
    if [[ "$was" == started ]]; then
      qm_agent_up "$vmid" "$timeout"
      echo "vm-restart: VM $vmid ($node_name) restarted: its pending hardware applied"
    else
      echo "vm-restart: VM $vmid ($node_name): nothing pending"
    fi
    return 0
  fi
  [[ "$was" != started ]] ||
    fail "VM $vmid ($node_name) after its restart" "no pending change" "$keys still pending (see qm pending $vmid)"
  qm_agent_up "$vmid" "$timeout"
  qm_guest_step "$vmid" "$run_for" "hold step" "$guest_step" "${guest_args[@]}"
  [[ "$QM_CODE" == 0 ]] || fail "guest" "exit code 0 from the hold step in VM $vmid" "$QM_CODE (its message is above)"
  grep -qE '^hold: ' <<<"$QM_OUT" || fail "guest" "a hold line from the hold step in VM $vmid" "none"
  put_file "$marker" stopping
  qm shutdown "$vmid" --timeout 300 --forceStop 1
  put_file "$marker" started
  qm start "$vmid" 9>&-
  keys="$(pending_keys)"
  [[ -z "$keys" ]] ||
    fail "VM $vmid ($node_name) after its restart" "no pending change" "$keys still pending (see qm pending $vmid)"
  qm_agent_up "$vmid" "$timeout"
  rm -f "$marker"
  echo "vm-restart: VM $vmid ($node_name) restarted: its pending hardware applied"
}

main "$@" </dev/null
