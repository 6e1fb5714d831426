#!/usr/bin/env bash
# A MIG geometry change on a live node, around the label change (the node's NodePatch) that makes the GPU
# Operator's mig-manager repartition its GPUs. Sent after guest_lib.sh, guest_rollout.sh and guest_mig_mode.sh.
#
#   begin:   when the node's nvidia.com/mig.config label holds another geometry, or (same geometry) a GPU's MIG
#            mode is not the wanted one, take a rollout slot, cordon and drain it (GPU pods would keep mig-manager
#            from repartitioning, and new ones would land mid-change); a node with no such label yet (first
#            provisioning) takes no slot. Then set the MIG mode each --mig-mode GPU needs (guest_mig_mode.sh), so
#            mig-manager finds it right; prints the mig-restart line.
#   restart: run by the Proxmox-side mig-restart step through the QEMU guest agent, after the label change: the
#            MIG mode again and the mig-restart line, from NVML now. When a restart is needed, mig-manager's state
#            label (failed, or rebooting: it could not reset the GPU either) is recorded as stale in the node's
#            annotation proxmox-gpu-cluster.io/mig-restart, so the end step waits for its report after the restart.
#   end:     the GPUs run the wanted MIG mode (else fail: the restart did not apply it); for a node begin cordoned:
#            wait (bounded) until the label holds the wanted geometry and mig-manager reports
#            nvidia.com/mig.config.state=success, then uncordon and give the slot back; "failed" fails, naming the
#            node, the geometry and where to look; the node then stays cordoned and keeps its slot
#            (guest_rollout.sh), and the message says how to free it.
# The Kubernetes side is the node agent's cluster.py (mig); this script checks the arguments and the MIG mode.
# mig-manager itself only tears down GPU clients and may reboot the guest (WITH_REBOOT), which does not reset a
# passed-through GPU: NVIDIA/mig-parted deployments/gpu-operator/reconfigure-mig.sh sets "rebooting", and
# "failed" when `nvidia-mig-parted assert --mode-only` still fails after it; with the mode already right it only
# applies the geometry.
#
# Usage: guest_mig.sh --phase begin|restart|end --mig-config NAME --timeout SECONDS --operator-namespace NS
#                     [--mig-mode INDEX=1|0 ...] --rollout 1 --rollout-node NAME --rollout-api HOST:PORT ...
set -euo pipefail
# shellcheck disable=SC2034 # read by die() in guest_lib.sh
STEP="mig"

phase="" wanted="" timeout="" namespace=""
while (($#)); do
  case "$1" in
  --phase) phase="$2" ;;
  --mig-config) wanted="$2" ;;
  --timeout) timeout="$2" ;;
  --operator-namespace) namespace="$2" ;;
  *) mig_mode_arg "$1" "$2" || rollout_arg "$1" "$2" || die "unknown argument $1" ;;
  esac
  shift 2
done
rollout_check_args
[[ "$phase" =~ ^(begin|restart|end)$ ]] || fail "--phase" "begin, restart or end" "'$phase'"
[[ "$wanted" =~ ^[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?$ ]] || fail "--mig-config" "a label value" "'$wanted'"
[[ "$timeout" =~ ^[0-9]{1,5}$ ]] || fail "--timeout" "seconds" "'$timeout'"
[[ "$namespace" =~ ^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$ ]] || fail "--operator-namespace" "a namespace" "'$namespace'"
((ROLLOUT)) || fail "--rollout" "1 (a MIG change rolls through a slot)" "0"

mig_agent() {
  rollout_agent mig --mig-config "$wanted" --timeout "$timeout" --operator-namespace "$namespace" "$@" || exit
}

main() {
  local due=0
  guest_begin # one step at a time on this machine
  if ! rollout_joined; then
    echo "mig: $ROLLOUT_NODE has not joined; nothing to roll"
    [[ "$phase" != restart ]] || echo "mig-restart: not-needed"
    return 0
  fi
  if ((${#MIG_MODES[@]})) && ! mig_driver; then
    echo "mig: no NVIDIA driver runs on $ROLLOUT_NODE yet (the operator's driver container): mig-manager sets the MIG mode"
    MIG_MODES=()
  fi
  case "$phase" in
  begin)
    ! mig_mode_due || due=1
    mig_agent --phase begin --mode-change "$due"
    mig_mode_apply
    ;;
  restart)
    ((${#MIG_MODES[@]})) || echo "mig-restart: not-needed"
    mig_mode_apply
    if ((MIG_RESTART)); then
      mig_agent --phase restart
    fi
    ;;
  end)
    mig_mode_report
    ((MIG_RESTART == 0)) || fail "MIG mode" "the wanted mode on every GPU after the VM restart" \
      "a mode still pending (the restart did not reset the GPU: check the VM's hostpci devices and the host's reset support)"
    mig_agent --phase end
    ;;
  esac
}

main "$@" </dev/null
