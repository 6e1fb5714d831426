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
#            MIG mode again (set where it is not pending yet: a first provisioning in operator driver mode) and the
#            mig-restart line, from NVML now. In operator driver mode it (and end) first waits (bounded by
#            --timeout, shared with what follows) for the driver container to answer: on a first provisioning the
#            operator is installed after the node's labels, and after every VM start the container loads the
#            driver again. When a restart is needed, the agent first holds the node, whatever begin did (begin
#            drains nothing on a first provisioning, nor when the driver container was down then): a rollout slot
#            (bounded wait; a node with no workload takes one too), the cordon and the drain (bounded); no slot or
#            no drain in time fails the step and nothing restarts. Then it waits (same budget) for mig-manager's
#            report for the current label (failed or rebooting; a mode not yet current rules out a success for it), then
#            records that state as stale in the node's annotation proxmox-gpu-cluster.io/mig-restart, so the end
#            step waits for its report after the restart. Without a report in time it restarts anyway: the reset
#            is what applies the mode, and mig-manager runs for the label again at its start.
#   end:     the GPUs run the wanted MIG mode (else fail: the restart did not apply it); for a node begin or the
#            restart step cordoned, or one the restart step restarted (its annotation): wait
#            (bounded) until the label holds the wanted geometry and mig-manager reports
#            nvidia.com/mig.config.state=success, then uncordon and give the slot back; "failed" fails, naming the
#            node, the geometry and where to look; the node then stays cordoned and keeps its slot
#            (guest_rollout.sh), and the message says how to free it. With --mig-config-map (the mig-parted
#            ConfigMap that names the geometry), a "failed" from a mig-manager that does not read that ConfigMap
#            yet, or from before its pod with it started, is waited through (agent/mig_manager.py): a new custom
#            geometry reaches mig-manager only with the release, after the label.
# The Kubernetes side is the node agent's mig_manager.py; this script checks the arguments and the MIG mode.
# mig-manager itself only tears down GPU clients and may reboot the guest (WITH_REBOOT), which does not reset a
# passed-through GPU. What it does, at the k8s-mig-manager tags the supported charts pin (gpu-operator v25.10.1:
# v0.13.1, v26.7.0: v0.15.0; NVIDIA/mig-parted pkg/mig/reconfigure/reconfigure.go, Run, the Go port of
# deployments/container/reconfigure-mig.sh): "success" at once when `nvidia-mig-parted assert` passes for the
# label's config; else "pending", the GPU clients torn down, `apply --mode-only` and `assert --mode-only` (the
# CURRENT mode: pkg/mig/mode/nvml.go GetMigMode), which fails while the mode waits for a reset; with WITH_REBOOT
# "rebooting" and a reboot, without it the geometry's apply fails and the state is "failed". It runs for the
# node's label at its start and on every label change (cmd/nvidia-mig-manager/main.go: the informer's AddFunc and
# UpdateFunc), so after the VM restart it reports again.
#
# Usage: guest_mig.sh --phase begin|restart|end --mig-config NAME --timeout SECONDS --operator-namespace NS
#                     [--mig-config-map CONFIGMAP] [--mig-mode INDEX=1|0 ...] --rollout 1 --rollout-node NAME --rollout-api HOST:PORT ...
set -euo pipefail
# shellcheck disable=SC2034 # read by die() in guest_lib.sh
STEP="mig"

phase="" wanted="" timeout="" namespace="" config_map=""
while (($#)); do
  case "$1" in
  --phase) phase="$2" ;;
  --mig-config) wanted="$2" ;;
  --mig-config-map) config_map="$2" ;;
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
[[ -z "$config_map" || "$config_map" =~ ^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$ ]] ||
  fail "--mig-config-map" "a ConfigMap name" "'$config_map'"
((ROLLOUT)) || fail "--rollout" "1 (a MIG change rolls through a slot)" "0"

# mig_driver_wait: wait until an NVIDIA driver answers the MIG query; takes the time waited off --timeout (the
# agent's wait for mig-manager shares it). A host driver answers at once (or its failure is the step's). The GPU
# Operator's driver container shows its root at /run/nvidia/driver before its kernel module loads (nvidia-smi exits
# 9 then: "couldn't communicate with the NVIDIA driver"), so only an answer counts. Restart and end only, never
# begin: on a first provisioning the operator is installed after the node's labels, which wait for begin.
mig_driver_wait() {
  local out="" rc want saw poll="$ROLLOUT_POLL" waited=0
  command -v nvidia-smi >/dev/null && return 0
  while :; do
    rc=1
    if [[ -x "$ROOT$MIG_DRIVER_ROOT/usr/bin/nvidia-smi" ]]; then
      rc=0
      out="$(mig_smi --query-gpu=index,mig.mode.current,mig.mode.pending --format=csv,noheader 2>&1)" || rc=$?
    fi
    ((rc != 0)) || break
    if ((waited >= timeout)); then
      want="the GPU Operator's driver container answering nvidia-smi within ${timeout}s"
      saw="no $MIG_DRIVER_ROOT/usr/bin/nvidia-smi yet"
      [[ -z "$out" ]] || saw="exit $rc: ${out%%$'\n'*}"
      fail "NVIDIA driver on $ROLLOUT_NODE" "$want (kubectl -n $namespace get pods -l app=nvidia-driver-daemonset)" "$saw"
    fi
    ((waited > 0)) || echo "mig: waiting for the GPU Operator's driver container on $ROLLOUT_NODE (up to ${timeout}s)"
    sleep "$poll"
    waited=$((waited + poll))
  done
  ((waited == 0)) || echo "mig: the driver container answers after ${waited}s"
  timeout=$((timeout > waited ? timeout - waited : 0))
}

mig_agent() {
  local map=()
  [[ -z "$config_map" ]] || map=(--mig-config-map "$config_map")
  rollout_python "$PGC_AGENT_DIR/mig_manager.py" --mig-config "$wanted" --timeout "$timeout" \
    --operator-namespace "$namespace" "${map[@]}" "$@" || exit
}

main() {
  local due=0
  guest_begin # one step at a time on this machine
  if ! rollout_joined; then
    echo "mig: $ROLLOUT_NODE has not joined; nothing to roll"
    [[ "$phase" != restart ]] || echo "mig-restart: not-needed"
    return 0
  fi
  if [[ "$phase" != begin ]] && ((${#MIG_MODES[@]})); then
    mig_driver_wait # the restart step waited for it too, but the VM may have restarted since
  elif ((${#MIG_MODES[@]})) && ! mig_driver; then
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
