#!/usr/bin/env bash
# A MIG geometry change on a live node, around the label change (the node's NodePatch) that makes the GPU
# Operator's mig-manager repartition its GPUs. Sent after guest_lib.sh and guest_rollout.sh.
#
#   begin: when the node's nvidia.com/mig.config label holds another geometry, take a rollout slot, cordon and
#          drain it (GPU pods would keep mig-manager from repartitioning, and new ones would land mid-change);
#          a node with no such label yet (first provisioning) takes no slot.
#   end:   for a node begin cordoned: wait (bounded) until the label holds the wanted geometry and mig-manager
#          reports nvidia.com/mig.config.state=success, then uncordon and give the slot back; "failed" fails,
#          naming the node, the geometry and where to look; the node then stays cordoned and frees its slot.
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

node_label() {
  rollout_kube get node "$ROLLOUT_NODE" -o "jsonpath={.metadata.labels.nvidia\.com/$1}"
}

begin() {
  local current
  current="$(node_label mig.config)"
  if [[ -z "$current" || "$current" == "$wanted" ]]; then
    echo "mig: $ROLLOUT_NODE: ${current:-no geometry yet} -> $wanted: nothing to drain"
    return 0
  fi
  rollout_begin "MIG $current -> $wanted"
}

end() {
  local waited=0 label state
  ROLLOUT_SLOT="$(rollout_ours)"
  if [[ -z "$ROLLOUT_SLOT" ]]; then
    echo "mig: $ROLLOUT_NODE was not cordoned for a MIG change; nothing to wait for"
    return 0
  fi
  slot_renew
  while :; do
    label="$(node_label mig.config)" state="$(node_label mig.config.state)"
    if [[ "$label" == "$wanted" && "$state" == success ]]; then
      break
    elif [[ "$label" == "$wanted" && "$state" == failed ]]; then
      fail "nvidia.com/mig.config.state" "success for $wanted on $ROLLOUT_NODE" \
        "failed: see kubectl logs -n $namespace -l app=nvidia-mig-manager --tail=100 (a GPU process still running, or a geometry the GPU refuses)"
    elif ((waited >= timeout)); then
      fail "nvidia.com/mig.config.state" "success for $wanted on $ROLLOUT_NODE within ${timeout}s" \
        "label ${label:-none}, state ${state:-none} (is mig-manager running in $namespace?)"
    fi
    sleep "$ROLLOUT_POLL"
    waited=$((waited + ROLLOUT_POLL))
  done
  echo "mig: $ROLLOUT_NODE runs $wanted (mig-manager: success)"
  rollout_end
}

main() {
  if ! rollout_joined; then
    echo "mig: $ROLLOUT_NODE has not joined; nothing to roll"
    return 0
  fi
  "$phase"
}

main "$@" </dev/null
