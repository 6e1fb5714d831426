#!/usr/bin/env bash
# Retire a Kubernetes node from the inside before its machine goes away: cordon, drain (evictions, so
# PodDisruptionBudgets are respected; bounded), delete the Node object, then `kubeadm reset`. Sent after
# guest_lib.sh; on worker VMs the Proxmox node runs it through the QEMU guest agent (retire_vm.sh).
#
# Usage: guest_drain.sh --node-name NAME --api-endpoint HOST:PORT --timeout SECONDS [--delete-emptydir-data 0|1]
#                       [--force 0|1] [--kubeadm-reset 0|1]
# kubectl talks to --api-endpoint (the address the node joined through, which it can reach and whose certificate
# the cluster CA signs) as the node itself: kubelet's kubeconfig, /etc/kubernetes/kubelet.conf. No credential
# reaches this step; a machine without that file has not joined (or was reset) and has nothing to drain.
# The work is the node agent's cluster.py (retire), next to this step's script in its bundle (PGC_AGENT_DIR).
# A drain that does not finish in time fails, naming the pods still on the node (and those a disruption budget
# protects); the node then stays cordoned, nothing is reset and the Node object stays.
set -euo pipefail
# shellcheck disable=SC2034 # read by die() in guest_lib.sh
STEP="drain"

node_name="" api_endpoint="" timeout="" emptydir=1 force=0 reset=0
while (($#)); do
  case "$1" in
  --node-name) node_name="$2" ;;
  --api-endpoint) api_endpoint="$2" ;;
  --timeout) timeout="$2" ;;
  --delete-emptydir-data) emptydir="$2" ;;
  --force) force="$2" ;;
  --kubeadm-reset) reset="$2" ;;
  *) die "unknown argument $1" ;;
  esac
  shift 2
done
[[ "$node_name" =~ ^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$ ]] || fail "--node-name" "a DNS label" "'$node_name'"
[[ "$api_endpoint" =~ ^([A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\]):[0-9]{1,5}$ ]] ||
  fail "--api-endpoint" "host:port or [IPv6]:port" "'$api_endpoint'"
[[ "$timeout" =~ ^[0-9]{1,5}$ ]] || fail "--timeout" "seconds" "'$timeout'"
for flag in "$emptydir" "$force" "$reset"; do
  [[ "$flag" =~ ^[01]$ ]] || fail "flags" "0 or 1" "'$flag'"
done

PGC_AGENT_DIR="${PGC_AGENT_DIR:-$(dirname "${BASH_SOURCE[0]:-.}")}"

main() {
  local agent="$PGC_AGENT_DIR/cluster.py" credential="$ROOT/etc/kubernetes/kubelet.conf"
  if ! command -v kubectl >/dev/null || [[ ! -f "$credential" ]]; then
    echo "retire: warning: $node_name has no kubelet credential here (/etc/kubernetes/kubelet.conf) or no kubectl:" \
      "it was not drained; if its Node object is still in the cluster, delete it with kubectl delete node $node_name"
    ((reset)) && kubeadm reset --force >/dev/null 2>&1 && echo "retire: kubeadm reset"
    return 0
  fi
  guest_begin # one step at a time on this machine
  [[ -f "$agent" ]] || fail "node agent" "cluster.py in $PGC_AGENT_DIR" "none"
  python3 "$agent" retire --node-name "$node_name" --api-endpoint "$api_endpoint" --kubeconfig "$credential" \
    --timeout "$timeout" --delete-emptydir-data "$emptydir" --force "$force" --kubeadm-reset "$reset" || exit
}

main "$@" </dev/null
