#!/usr/bin/env bash
# A MIG geometry change on a live node, around the label change (the node's NodePatch) that makes the GPU
# Operator's mig-manager repartition its GPUs. Sent after guest_lib.sh and guest_rollout.sh.
#
#   begin: when the node's nvidia.com/mig.config label holds another geometry, take a rollout slot, cordon and
#          drain it (GPU pods would keep mig-manager from repartitioning, and new ones would land mid-change);
#          a node with no such label yet (first provisioning) takes no slot.
#   end:   for a node begin cordoned: wait (bounded) until the label holds the wanted geometry and mig-manager
#          reports nvidia.com/mig.config.state=success, then uncordon and give the slot back; "failed" fails,
#          naming the node, the geometry and where to look; the node then stays cordoned and keeps its slot
#          (guest_rollout.sh), and the message says how to free it.
# Both phases are the node agent's cluster.py (mig); this script checks the arguments and writes the kubeconfig.
#
# Usage: guest_mig.sh --phase begin|end --mig-config NAME --timeout SECONDS --operator-namespace NS
#                     --rollout 1 --rollout-node NAME --rollout-api HOST:PORT ... (guest_rollout.sh)
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
  *) rollout_arg "$1" "$2" || die "unknown argument $1" ;;
  esac
  shift 2
done
rollout_check_args
[[ "$phase" =~ ^(begin|end)$ ]] || fail "--phase" "begin or end" "'$phase'"
[[ "$wanted" =~ ^[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?$ ]] || fail "--mig-config" "a label value" "'$wanted'"
[[ "$timeout" =~ ^[0-9]{1,5}$ ]] || fail "--timeout" "seconds" "'$timeout'"
[[ "$namespace" =~ ^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$ ]] || fail "--operator-namespace" "a namespace" "'$namespace'"
((ROLLOUT)) || fail "--rollout" "1 (a MIG change rolls through a slot)" "0"

main() {
  guest_begin # one step at a time on this machine
  if ! rollout_joined; then
    echo "mig: $ROLLOUT_NODE has not joined; nothing to roll"
    return 0
  fi
  rollout_agent mig --phase "$phase" --mig-config "$wanted" --timeout "$timeout" --operator-namespace "$namespace" ||
    exit
}

main "$@" </dev/null
