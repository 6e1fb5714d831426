#!/usr/bin/env bash
# Retire a Kubernetes node from the inside before its machine goes away: cordon, drain (evictions, so
# PodDisruptionBudgets are respected; bounded), `kubeadm reset`, and delete the Node object. Sent after
# guest_lib.sh; on worker VMs the Proxmox node runs it through the QEMU guest agent (retire_vm.sh).
#
# Usage: guest_drain.sh --node-name NAME --api-endpoint HOST:PORT --timeout SECONDS [--delete-emptydir-data 0|1]
#                       [--force 0|1] [--kubeadm-reset 0|1]
# kubectl talks to --api-endpoint (the address the node joined through, which it can reach and whose certificate
# the cluster CA signs), not to the server in the kubeconfig, which may be an address only the operator reaches.
# The admin kubeconfig is never an argument or an environment variable: it arrives as the shell variable
# PGC_KUBECONFIG assigned at the top of this script's stdin, is written to a mode-600 file under /run that only its
# path reaches kubectl through, is removed when the step ends (a killed run's file when the next one starts), and
# is never printed.
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
WORK_DIR="" # global: the EXIT trap removes it after main has returned

main() {
  local agent="$PGC_AGENT_DIR/cluster.py"
  if ! command -v kubectl >/dev/null; then
    echo "retire: warning: kubectl is not installed here: $node_name was not drained and its Node object stays; delete it with kubectl delete node $node_name"
    ((reset)) && kubeadm reset --force >/dev/null 2>&1 && echo "retire: kubeadm reset"
    return 0
  fi
  guest_begin # one step at a time on this machine; a killed run's kubeconfig directory goes
  mkdir -p "$ROOT/run"
  WORK_DIR="$(umask 077 && mktemp -d "$ROOT/run/pgc-drain.$$.XXXXXX")"
  trap 'rm -rf "$WORK_DIR"' EXIT
  (umask 077 && printf '%s\n' "${PGC_KUBECONFIG:-}" >"$WORK_DIR/kubeconfig")
  [[ -f "$agent" ]] || fail "node agent" "cluster.py in $PGC_AGENT_DIR" "none"
  python3 "$agent" retire --node-name "$node_name" --api-endpoint "$api_endpoint" --kubeconfig "$WORK_DIR/kubeconfig" \
    --timeout "$timeout" --delete-emptydir-data "$emptydir" --force "$force" --kubeadm-reset "$reset" || exit
}

main "$@" </dev/null
