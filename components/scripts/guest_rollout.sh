#!/usr/bin/env bash
# Rolling disruption of joined GPU nodes, shared by the driver, verify and MIG steps (after guest_lib.sh, before
# the step's script). A step about to disrupt a node that has joined the cluster takes a slot, cordons and drains
# it (rollout_begin); the verify step uncordons it and gives the slot back once the node passed (rollout_end). A
# node a failed step leaves cordoned keeps its slot, so it keeps counting against maxUnavailable, until a later run
# passes or an operator frees it. A node that has not joined yet (first provisioning) takes no slot.
#
# The logic is the node agent's cluster.py (ConfigMaps in --rollout-namespace as slots, ownership, cordon, drain;
# see its docstring), run with the machine's python3 from PGC_AGENT_DIR (the step's bundle directory, or next to
# this script). These functions keep the steps' interface: rollout_arg, rollout_check_args, rollout_joined,
# rollout_begin "<why>", rollout_resume, rollout_end, rollout_cleanup.
#
# kubectl acts as the node itself, with kubelet's kubeconfig (/etc/kubernetes/kubelet.conf, which only a joined
# node has): no credential reaches the step. It talks to --rollout-api (the address the node joined through).
set -euo pipefail

# The defaults are RolloutSpec's (render/guest_scripts.py passes only the settings that differ; a test compares).
ROLLOUT=0 ROLLOUT_NODE="" ROLLOUT_API="" ROLLOUT_MAX=1 ROLLOUT_LEASE=3600 ROLLOUT_WAIT=21600
ROLLOUT_DRAIN_TIMEOUT=600 ROLLOUT_EMPTYDIR=1 ROLLOUT_FORCE=0 ROLLOUT_KUBECONFIG="" ROLLOUT_NAMESPACE=proxmox-gpu-cluster
ROLLOUT_POLL="${PGC_ROLLOUT_POLL:-5}"
PGC_AGENT_DIR="${PGC_AGENT_DIR:-$(dirname "${BASH_SOURCE[0]:-.}")}"

# rollout_arg <flag> <value>: consume one --rollout-* argument; returns 1 for any other flag.
rollout_arg() {
  case "$1" in
  --rollout) ROLLOUT="$2" ;;
  --rollout-node) ROLLOUT_NODE="$2" ;;
  --rollout-api) ROLLOUT_API="$2" ;;
  --rollout-namespace) ROLLOUT_NAMESPACE="$2" ;;
  --rollout-max-unavailable) ROLLOUT_MAX="$2" ;;
  --rollout-lease-seconds) ROLLOUT_LEASE="$2" ;;
  --rollout-wait-seconds) ROLLOUT_WAIT="$2" ;;
  --rollout-drain-timeout) ROLLOUT_DRAIN_TIMEOUT="$2" ;;
  --rollout-delete-emptydir-data) ROLLOUT_EMPTYDIR="$2" ;;
  --rollout-force) ROLLOUT_FORCE="$2" ;;
  *) return 1 ;;
  esac
}

rollout_check_args() {
  [[ "$ROLLOUT" =~ ^[01]$ ]] || fail "--rollout" "0 or 1" "'$ROLLOUT'"
  ((ROLLOUT)) || return 0
  [[ "$ROLLOUT_NODE" =~ ^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$ ]] || fail "--rollout-node" "a DNS label" "'$ROLLOUT_NODE'"
  [[ "$ROLLOUT_API" =~ ^([A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\]):[0-9]{1,5}$ ]] ||
    fail "--rollout-api" "host:port or [IPv6]:port" "'$ROLLOUT_API'"
  [[ "$ROLLOUT_NAMESPACE" =~ ^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$ ]] ||
    fail "--rollout-namespace" "a namespace" "'$ROLLOUT_NAMESPACE'"
  [[ "$ROLLOUT_MAX" =~ ^[1-9][0-9]{0,3}$ ]] || fail "--rollout-max-unavailable" "1 to 9999" "'$ROLLOUT_MAX'"
  local n
  for n in "$ROLLOUT_LEASE" "$ROLLOUT_WAIT" "$ROLLOUT_DRAIN_TIMEOUT"; do
    [[ "$n" =~ ^[0-9]{1,6}$ ]] || fail "rollout timing" "seconds" "'$n'"
  done
  [[ "$ROLLOUT_EMPTYDIR" =~ ^[01]$ && "$ROLLOUT_FORCE" =~ ^[01]$ ]] ||
    fail "rollout drain flags" "0 or 1" "'$ROLLOUT_EMPTYDIR' '$ROLLOUT_FORCE'"
  [[ "$ROLLOUT_POLL" =~ ^[1-9][0-9]{0,3}$ ]] || fail "PGC_ROLLOUT_POLL" "seconds" "'$ROLLOUT_POLL'"
}

# rollout_agent <cluster.py command and flags...>: run it with this node's rollout settings; its exit code.
rollout_agent() {
  rollout_python "$PGC_AGENT_DIR/cluster.py" "$@"
}

# rollout_python <agent module> <its flags...>: run it with this node's rollout settings; its exit code.
rollout_python() {
  local module="$1"
  shift
  python3 "$module" "$@" --node "$ROLLOUT_NODE" --api "$ROLLOUT_API" \
    --kubeconfig "$ROLLOUT_KUBECONFIG" --namespace "$ROLLOUT_NAMESPACE" --max-unavailable "$ROLLOUT_MAX" \
    --lease-seconds "$ROLLOUT_LEASE" --wait-seconds "$ROLLOUT_WAIT" --drain-timeout "$ROLLOUT_DRAIN_TIMEOUT" \
    --emptydir "$ROLLOUT_EMPTYDIR" --force "$ROLLOUT_FORCE" --poll "$ROLLOUT_POLL"
}

# rollout_credentials: the node's own credential for kubectl, and the EXIT trap that says what is true after a
# failure.
rollout_credentials() {
  [[ -z "$ROLLOUT_KUBECONFIG" ]] || return 0
  command -v kubectl >/dev/null || fail "rollout" "kubectl on the node (installed by the join step)" "none"
  [[ -f "$PGC_AGENT_DIR/cluster.py" ]] || fail "rollout" "the node agent's cluster.py in $PGC_AGENT_DIR" "none"
  ROLLOUT_KUBECONFIG="$ROOT/etc/kubernetes/kubelet.conf"
  trap rollout_cleanup EXIT
}

# rollout_joined: this guest has joined the cluster (kubeadm wrote kubelet's kubeconfig) and its Node exists.
# An API server that does not answer fails the step (cluster.py prints the line).
rollout_joined() {
  ((ROLLOUT)) && [[ -f "$ROOT/etc/kubernetes/kubelet.conf" ]] || return 1
  rollout_credentials
  local code=0
  rollout_agent rollout joined || code=$?
  case "$code" in
  0) return 0 ;;
  3) return 1 ;;
  *) exit "$code" ;;
  esac
}

# rollout_begin <why>: take a slot (bounded wait), mark the node as ours, cordon and drain it, renew the slot.
rollout_begin() {
  rollout_agent rollout begin --why "$1" || exit
}

# rollout_resume: at the start of a later step, renew the slot of a node a rollout cordoned (if any).
rollout_resume() {
  rollout_agent rollout resume || exit
}

# rollout_end: after verification passed on a joined node (rollout_joined, called before the checks so that a
# failing one finds the EXIT trap set): uncordon it if a rollout cordoned it and give back every slot it holds.
rollout_end() {
  rollout_agent rollout end || exit
}

# rollout_cleanup (EXIT trap): after a failure, cluster.py says what is true (a node a rollout cordoned stays
# cordoned and keeps its slot, and how to free it; a slot taken before the cordon is given back).
# The step's exit status stays the one it exited with (a trap that returns does not change it).
rollout_cleanup() {
  local code=$?
  if ((code)) && [[ -n "$ROLLOUT_KUBECONFIG" ]]; then
    rollout_agent rollout cleanup >&2 || true
  fi
}
