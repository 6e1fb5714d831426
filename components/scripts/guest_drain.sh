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
# PGC_KUBECONFIG assigned at the top of this script's stdin, is written to a mode-600 file under /run for kubectl
# and removed when the step ends, and is never printed.
# A drain that does not finish in time fails, naming the pods still on the node (and those a disruption budget
# protects); the node then stays cordoned, nothing is reset and the Node object stays.
set -euo pipefail
# shellcheck disable=SC2034 # read by die() in guest_lib.sh
STEP="retire"

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

KUBECONFIG_FILE="" # global: the EXIT trap removes it after main has returned

kube() {
  kubectl --kubeconfig "$KUBECONFIG_FILE" --server "https://$api_endpoint" --request-timeout=30s "$@"
}

# remaining_pods: namespace/name of every pod still on the node that a drain moves (not DaemonSet or mirror pods).
remaining_pods() {
  kube get pods --all-namespaces --field-selector "spec.nodeName=$node_name" \
    -o jsonpath='{range .items[*]}{.metadata.namespace}/{.metadata.name} {.metadata.ownerReferences[0].kind} {.metadata.annotations.kubernetes\.io/config\.mirror}{"\n"}{end}' |
    awk '$1 != "" && $2 != "DaemonSet" && $3 == "" { print $1 }'
}

drain() {
  local flags=(--ignore-daemonsets "--timeout=${timeout}s") output pod pods=() blocked bare seen
  ((emptydir)) && flags+=(--delete-emptydir-data)
  ((force)) && flags+=(--force)
  if output="$(kube drain "$node_name" "${flags[@]}" 2>&1)"; then
    echo "retire: drained $node_name"
    return 0
  fi
  # kubectl names a pod whose eviction a PodDisruptionBudget refuses as: pods/"NAME" -n "NAMESPACE" ... budget,
  # and refuses up front (evicting nothing) when pods have no controller: ... (use --force to override): ns/a,ns/b
  blocked="$(sed -nE 's#.*pods/"([^"]+)" -n "([^"]+)".*disruption budget.*#\2/\1#p' <<<"$output" | sort -u)"
  bare="$(sed -nE 's/.*use --force to override\): (.*)$/\1/p' <<<"$output" | head -n 1 | tr ',' '\n')"
  while read -r pod; do
    [[ -n "$pod" ]] || continue
    if grep -qxF "$pod" <<<"$blocked"; then
      pods+=("$pod (a PodDisruptionBudget refuses its eviction)")
    elif grep -qxF "$pod" <<<"$bare"; then
      pods+=("$pod (no controller: kubernetes.drain.force deletes it)")
    else
      pods+=("$pod")
    fi
  done < <(remaining_pods || true)
  seen="$(printf '%s, ' "${pods[@]}")"
  seen="${seen%, }"
  fail "drain" "no pods left on $node_name within ${timeout}s" \
    "${seen:-$(tail -n 1 <<<"$output")}; $node_name stays cordoned: relax the budget or move the pods (or set kubernetes.drain.force for pods without a controller), then run pulumi up again"
}

main() {
  local present
  if ! command -v kubectl >/dev/null; then
    echo "retire: warning: kubectl is not installed here: $node_name was not drained and its Node object stays; delete it with kubectl delete node $node_name"
    ((reset)) && kubeadm reset --force >/dev/null 2>&1 && echo "retire: kubeadm reset"
    return 0
  fi
  mkdir -p "$ROOT/run"
  KUBECONFIG_FILE="$(umask 077 && mktemp "$ROOT/run/pgc-kubeconfig.XXXXXX")"
  trap 'rm -f "$KUBECONFIG_FILE"' EXIT
  printf '%s\n' "${PGC_KUBECONFIG:-}" >"$KUBECONFIG_FILE"
  present="$(kube get node "$node_name" --ignore-not-found -o name 2>&1)" ||
    fail "kubectl get node" "an answer from the API server" "$(tail -n 1 <<<"$present")"
  if [[ -z "$present" ]]; then
    echo "retire: $node_name is not in the cluster; nothing to drain"
  else
    kube cordon "$node_name" >/dev/null
    echo "retire: cordoned $node_name"
    drain
  fi
  if ((reset)); then
    # Stops the kubelet, so the Node object deleted next is not registered again.
    kubeadm reset --force >/dev/null 2>&1 || fail "kubeadm reset" "success" "a failure (exit $?)"
    echo "retire: kubeadm reset"
  fi
  if [[ -n "$present" ]]; then
    kube delete node "$node_name" --ignore-not-found >/dev/null
    echo "retire: deleted Node $node_name"
  fi
}

main "$@" </dev/null
