#!/usr/bin/env bash
# Restart a MIG worker's VM from Proxmox when its GPUs' new MIG mode waits for a GPU reset. Runs on the VM's Proxmox
# node as root, after the node's nvidia.com/mig.config label changed, inside the node's rollout slot (the guest's
# MIG begin step drained it and set the mode; where begin held nothing, a first provisioning or a mode it could not
# read, the guest side takes the slot, cordons and drains before it answers "needed").
#
# Why from Proxmox: MIG mode takes effect only at a GPU reset (NVIDIA MIG User Guide); in a passthrough VM the guest
# often cannot reset the GPU, and NVML reports the mode pending (mig.mode.pending != mig.mode.current). A reboot
# inside the guest, which is what mig-manager's WITH_REBOOT does, keeps the same QEMU process; stopping the VM and
# starting it again makes a new QEMU process, and vfio-pci resets the passed-through function when it opens it. Proxmox
# documents `qm reboot` as the same ("Reboot the VM by shutting it down, and starting it again. Applies pending
# changes."); the two steps are run here one by one so a run killed in between is finished by the next (marker).
#
# Decided from what the guest reports now: the guest's installed MIG step (--phase restart, through the QEMU guest
# agent) prints "mig-restart: needed (...)" or "mig-restart: not-needed". A re-run after the restart finds the mode
# applied and does nothing. The marker $STATE/mig-restart-<vmid> (written before the shutdown: "stopping", then
# "started") lets a run that finds the VM stopped start it again, and a mode still pending after this step's own
# restart fail instead of restarting again. Prints "mig-restart: VM <id> (<node>) restarted" or "... not restarted".
# Sent after host_lib.sh and host_qm.sh.
#
# Usage: mig_restart.sh --vmid N --node-name NAME --timeout SECONDS --guest-step PATH -- GUEST-ARGS...
set -euo pipefail
# shellcheck disable=SC2034 # read by fail() in host_lib.sh
STEP="mig-restart"

vmid="" node_name="" timeout="" guest_step="" guest_args=() run_for=0
while (($#)); do
  case "$1" in
  --)
    shift
    guest_args=("$@")
    break
    ;;
  *)
    qm_step_arg "$1" "${2-}" ||
      fail arguments "--vmid, --node-name, --timeout, --guest-step, then -- and the guest's arguments" "$1"
    ;;
  esac
  shift 2
done

# guest_says [retry seconds]: run the guest's MIG step (--phase restart); sets SAYS to its mig-restart line (its
# output is shown). The step decides only once it can: in operator driver mode it waits for the driver container
# (a first provisioning: the operator is installed alongside this step; after a start: it loads the driver again)
# and, for a restart, for mig-manager's report. Right after a start the guest may not reach the API server yet: a
# step that fails is run again every 10 s within the retry time (0: fail at once).
guest_says() {
  local retry="${1:-0}" waited=0
  while :; do
    qm_guest_step "$vmid" "$run_for" "MIG step" "$guest_step" "${guest_args[@]}"
    [[ "$QM_CODE" != 0 && waited -lt retry ]] || break
    echo "mig-restart: the guest's MIG step failed (exit $QM_CODE) right after the start; trying again in 10 s" >&2
    sleep 10
    waited=$((waited + 10))
  done
  [[ "$QM_CODE" == 0 ]] || fail "guest" "exit code 0 from the MIG step in VM $vmid" "$QM_CODE (its message is above)"
  SAYS="$(grep -m 1 -oE '^mig-restart: (needed|not-needed)' <<<"$QM_OUT" || true)"
  [[ -n "$SAYS" ]] || fail "guest" "a mig-restart line from the MIG step in VM $vmid" "none"
}

main() {
  qm_step_checks "MIG step" "qm"
  # qm's stderr, read after each call; removed however the step ends (a failure exits from inside guest_says).
  QM_ERR_FILE="$(mktemp)"
  trap 'rm -f "$QM_ERR_FILE"' EXIT
  # How long one run of the guest's step may take: its own --timeout bounds its waits (for the operator's driver
  # container and mig-manager's report), the agent's wait bounds the rest; before a restart it also holds the node
  # (qm_hold_seconds); 60 s for the rest of it.
  local guest_timeout
  guest_timeout="$(qm_guest_arg --timeout 0 "${guest_args[@]}")"
  [[ "$guest_timeout" =~ ^[0-9]{1,5}$ ]] || fail "guest arguments" "--timeout SECONDS" "'$guest_timeout'"
  qm_hold_seconds "${guest_args[@]}"
  run_for=$(((guest_timeout > timeout ? guest_timeout : timeout) + QM_HOLD_SECONDS + 60))
  host_lock "mig-restart VM $vmid" # not while host prep or a large-BAR step changes this node or VM
  local marker="$STATE/mig-restart-$vmid" was="" status key
  # The marker counts for this change only (a marker a killed run left for another MIG mode means nothing now).
  key="$(printf '%s\n' "${guest_args[@]}" | sha256sum | cut -c1-16)"
  [[ ! -f "$marker" ]] || was="$(sed -n "s/ $key\$//p" "$marker")"
  status="$(qm status "$vmid" 2>&1)" || fail "VM $vmid" "a VM on this node" "${status//$'\n'/ }"
  if [[ "$status" != *"status: running"* ]]; then
    # Stopped by this step (a run killed before its start): start it; stopped otherwise: not this step's to start.
    [[ -n "$was" ]] || fail "VM $vmid ($node_name)" "running" "${status//$'\n'/ }"
    put_file "$marker" "started $key"
    qm start "$vmid" 9>&- # QEMU outlives the step: it must not hold the node's lock
    was=started
  fi
  qm_agent_up "$vmid" "$timeout"
  guest_says "$([[ "$was" == started ]] && echo "$timeout" || echo 0)"
  if [[ "$SAYS" == "mig-restart: not-needed" ]]; then
    rm -f "$marker"
    echo "mig-restart: VM $vmid ($node_name) not restarted: its GPUs run the wanted MIG mode"
    return 0
  fi
  # Restarted by this step and still pending: another restart would not help.
  local unreset="still pending (the VM's GPUs were not reset: check the hostpci devices and the host's reset support; remove ${marker#"$ROOT"} to let the next run restart it again)"
  [[ "$was" != started ]] || fail "VM $vmid ($node_name) after its restart" "the GPUs' MIG mode applied" "$unreset"
  put_file "$marker" "stopping $key"
  qm shutdown "$vmid" --timeout 300 --forceStop 1
  put_file "$marker" "started $key"
  qm start "$vmid" 9>&-
  qm_agent_up "$vmid" "$timeout"
  guest_says "$timeout"
  [[ "$SAYS" == "mig-restart: not-needed" ]] ||
    fail "VM $vmid ($node_name) after its restart" "the GPUs' MIG mode applied" "$unreset"
  rm -f "$marker"
  echo "mig-restart: VM $vmid ($node_name) restarted: its GPUs' MIG mode applied"
}

main "$@" </dev/null
