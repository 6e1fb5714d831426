#!/usr/bin/env bash
# Rolling disruption of joined GPU nodes, shared by the driver and verify steps (sent after guest_lib.sh, before
# the step's script). A step about to disrupt a node that has joined the cluster takes a slot, cordons and drains
# it; the verify step uncordons it and gives the slot back once the node passed, or gives the slot back and leaves
# the node cordoned when it did not. A node that has not joined yet (first provisioning) takes no slot.
#
# Slots are coordination.k8s.io/v1 Leases kube-system/proxmox-gpu-cluster-rollout-<i>, i < --max-unavailable, so
# at most that many nodes are disrupted at once across the cluster, whatever runs the steps and however many in
# parallel. Taking one is an atomic create (or, for a lease whose holder stopped renewing it for longer than its
# duration, an atomic replace at the resourceVersion read: a crashed run cannot hold a slot forever); the holder
# renews it after the drain and when the verify (or MIG end) step starts. The node
# carries the annotation proxmox-gpu-cluster.io/rollout=<lease> while it is ours to uncordon, so a node an admin
# cordoned is never uncordoned here.
#
# The admin kubeconfig is never an argument or an environment variable: it arrives as the shell variable
# PGC_KUBECONFIG assigned at the top of stdin, goes to a mode-600 file under /run for kubectl and is removed when
# the step ends. kubectl talks to --api-endpoint (the address the node joined through).
set -euo pipefail

ROLLOUT=0 ROLLOUT_NODE="" ROLLOUT_API="" ROLLOUT_MAX=1 ROLLOUT_LEASE=3600 ROLLOUT_WAIT=21600
ROLLOUT_DRAIN_TIMEOUT=600 ROLLOUT_EMPTYDIR=1 ROLLOUT_FORCE=0 ROLLOUT_KUBECONFIG=""
ROLLOUT_NS="kube-system"
ROLLOUT_ANNOTATION="proxmox-gpu-cluster.io/rollout"
ROLLOUT_POLL="${PGC_ROLLOUT_POLL:-5}"

# rollout_arg <flag> <value>: consume one --rollout-* argument; returns 1 for any other flag.
rollout_arg() {
  case "$1" in
  --rollout) ROLLOUT="$2" ;;
  --rollout-node) ROLLOUT_NODE="$2" ;;
  --rollout-api) ROLLOUT_API="$2" ;;
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
  [[ "$ROLLOUT_MAX" =~ ^[1-9][0-9]{0,3}$ ]] || fail "--rollout-max-unavailable" "1 to 9999" "'$ROLLOUT_MAX'"
  local n
  for n in "$ROLLOUT_LEASE" "$ROLLOUT_WAIT" "$ROLLOUT_DRAIN_TIMEOUT"; do
    [[ "$n" =~ ^[0-9]{1,6}$ ]] || fail "rollout timing" "seconds" "'$n'"
  done
  [[ "$ROLLOUT_EMPTYDIR" =~ ^[01]$ && "$ROLLOUT_FORCE" =~ ^[01]$ ]] ||
    fail "rollout drain flags" "0 or 1" "'$ROLLOUT_EMPTYDIR' '$ROLLOUT_FORCE'"
}

rollout_kube() {
  kubectl --kubeconfig "$ROLLOUT_KUBECONFIG" --server "https://$ROLLOUT_API" --request-timeout=30s "$@"
}

# rollout_credentials: write the kubeconfig for kubectl (mode 600, removed when the step exits).
rollout_credentials() {
  [[ -z "$ROLLOUT_KUBECONFIG" ]] || return 0
  [[ -n "${PGC_KUBECONFIG:-}" ]] || fail "rollout" "the admin kubeconfig on stdin" "none"
  command -v kubectl >/dev/null || fail "rollout" "kubectl on the node (installed by the runtime step)" "none"
  mkdir -p "$ROOT/run"
  ROLLOUT_KUBECONFIG="$(umask 077 && mktemp "$ROOT/run/pgc-kubeconfig.XXXXXX")"
  trap rollout_cleanup EXIT
  printf '%s\n' "$PGC_KUBECONFIG" >"$ROLLOUT_KUBECONFIG"
}

# rollout_joined: this guest has joined the cluster (kubeadm wrote kubelet's kubeconfig) and its Node exists.
rollout_joined() {
  ((ROLLOUT)) && [[ -f "$ROOT/etc/kubernetes/kubelet.conf" ]] || return 1
  rollout_credentials
  local seen
  seen="$(rollout_kube get node "$ROLLOUT_NODE" --ignore-not-found -o name 2>&1)" ||
    fail "kubectl get node" "an answer from the API server" "$(tail -n 1 <<<"$seen")"
  [[ -n "$seen" ]]
}

# lease_json <name> [resourceVersion]: a Lease held by this node from now on, as JSON (emitted by python3).
lease_json() {
  python3 -c '
import datetime, json, sys
name, holder, seconds, version = sys.argv[1:5]
now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
meta = {"name": name, "namespace": sys.argv[5], "labels": {"app.kubernetes.io/managed-by": "proxmox-gpu-cluster"}}
if version:
    meta["resourceVersion"] = version
spec = {"holderIdentity": holder, "leaseDurationSeconds": int(seconds), "acquireTime": now, "renewTime": now}
print(json.dumps({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec}))
' "$1" "$ROLLOUT_NODE" "$ROLLOUT_LEASE" "${2:-}" "$ROLLOUT_NS"
}

# lease_state <name>: "<holder> <expired 0|1> <resourceVersion>" of an existing lease, nothing when there is none.
lease_state() {
  local json
  json="$(rollout_kube get lease "$1" -n "$ROLLOUT_NS" --ignore-not-found -o json)" || return 1
  [[ -n "$json" ]] || return 0
  python3 -c '
import datetime, json, sys
lease = json.loads(sys.stdin.read())
spec = lease.get("spec", {})
renew = spec.get("renewTime") or spec.get("acquireTime")
expired = 1
if renew:
    seen = datetime.datetime.strptime(renew.replace("Z", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z")
    age = (datetime.datetime.now(datetime.timezone.utc) - seen).total_seconds()
    expired = int(age > int(spec.get("leaseDurationSeconds") or 0))
print(spec.get("holderIdentity") or "-", expired, lease["metadata"]["resourceVersion"])
' <<<"$json"
}

# slot_try: take a free or expired slot (or find the one this node holds); prints its name on success.
slot_try() {
  local i name holder expired version
  for ((i = 0; i < ROLLOUT_MAX; i++)); do
    name="proxmox-gpu-cluster-rollout-$i"
    read -r holder expired version < <(lease_state "$name" || echo "? 0 ?") || true
    if [[ -z "${holder:-}" ]]; then
      lease_json "$name" | rollout_kube create -f - >/dev/null 2>&1 && echo "$name" && return 0
    elif [[ "$holder" == "$ROLLOUT_NODE" ]]; then
      echo "$name" && return 0
    elif [[ "$expired" == 1 ]]; then
      lease_json "$name" "$version" | rollout_kube replace -f - >/dev/null 2>&1 && echo "$name" && return 0
    fi
    holder="" expired="" version=""
  done
  return 1
}

# slot_renew: this node still holds ROLLOUT_SLOT: move its renewTime to now (an atomic replace), so only a run
# that died lets it expire, however long the drain, the install and the reboot took.
slot_renew() {
  local holder expired version
  read -r holder expired version < <(lease_state "$ROLLOUT_SLOT" || echo "? 0 ?") || true
  if [[ "${holder:-}" == "$ROLLOUT_NODE" ]]; then
    lease_json "$ROLLOUT_SLOT" "$version" | rollout_kube replace -f - >/dev/null
  fi
}

# rollout_resume: at the start of a later step, renew the slot of a node this project cordoned (if any).
rollout_resume() {
  ROLLOUT_SLOT="$(rollout_ours)"
  [[ -z "$ROLLOUT_SLOT" ]] || slot_renew
}

# slot_holders: who holds the slots now, for a message.
slot_holders() {
  local i holder rest
  for ((i = 0; i < ROLLOUT_MAX; i++)); do
    read -r holder rest < <(lease_state "proxmox-gpu-cluster-rollout-$i" || true) || true
    printf '%s ' "${holder:-free}"
    holder=""
  done
}

# rollout_begin <why>: take a slot (bounded wait), mark the node as ours, cordon and drain it.
ROLLOUT_SLOT=""
rollout_begin() {
  local waited=0 output
  until ROLLOUT_SLOT="$(slot_try)"; do
    ((waited < ROLLOUT_WAIT)) || fail "rollout slot" "one of $ROLLOUT_MAX free within ${ROLLOUT_WAIT}s" \
      "held by $(slot_holders)(pulumi up --parallel must exceed kubernetes.drain.maxUnavailable)"
    sleep "$ROLLOUT_POLL"
    waited=$((waited + ROLLOUT_POLL))
  done
  echo "rollout: $ROLLOUT_NODE took slot $ROLLOUT_SLOT ($1)"
  rollout_kube annotate node "$ROLLOUT_NODE" --overwrite "$ROLLOUT_ANNOTATION=$ROLLOUT_SLOT" >/dev/null
  rollout_kube cordon "$ROLLOUT_NODE" >/dev/null
  echo "rollout: cordoned $ROLLOUT_NODE"
  local flags=(--ignore-daemonsets "--timeout=${ROLLOUT_DRAIN_TIMEOUT}s")
  ((ROLLOUT_EMPTYDIR)) && flags+=(--delete-emptydir-data)
  ((ROLLOUT_FORCE)) && flags+=(--force)
  if ! output="$(rollout_kube drain "$ROLLOUT_NODE" "${flags[@]}" 2>&1)"; then
    fail "drain" "no pods left on $ROLLOUT_NODE within ${ROLLOUT_DRAIN_TIMEOUT}s" \
      "$(grep -E 'error|evict' <<<"$output" | tail -n 3 | paste -sd';' -); nothing was changed: move or relax what blocks it, then run pulumi up again"
  fi
  echo "rollout: drained $ROLLOUT_NODE"
  slot_renew
}

# rollout_ours: the slot this node was cordoned for (its annotation), nothing when it is not ours to uncordon.
rollout_ours() {
  rollout_kube get node "$ROLLOUT_NODE" -o "jsonpath={.metadata.annotations.proxmox-gpu-cluster\.io/rollout}"
}

# slot_release: give the slot back when this node holds it.
slot_release() {
  local holder rest
  [[ -n "$ROLLOUT_SLOT" ]] || return 0
  read -r holder rest < <(lease_state "$ROLLOUT_SLOT" || true) || true
  if [[ "${holder:-}" == "$ROLLOUT_NODE" ]]; then
    rollout_kube delete lease "$ROLLOUT_SLOT" -n "$ROLLOUT_NS" --ignore-not-found >/dev/null
    echo "rollout: released slot $ROLLOUT_SLOT"
  fi
}

# rollout_cleanup (EXIT trap): after a failure, a slot this node holds is given back (the node stays cordoned, so
# nothing schedules onto a half-changed node, and the other nodes go on); the kubeconfig file is removed.
rollout_cleanup() {
  local code=$?
  if ((code)) && [[ -n "$ROLLOUT_KUBECONFIG" ]]; then
    [[ -n "$ROLLOUT_SLOT" ]] || ROLLOUT_SLOT="$(rollout_ours 2>/dev/null || true)"
    if [[ -n "$ROLLOUT_SLOT" ]]; then
      slot_release >&2 || true
      echo "rollout: $ROLLOUT_NODE stays cordoned after this failure; its slot is free for the other nodes" >&2
    fi
  fi
  rm -f "$ROLLOUT_KUBECONFIG"
  return "$code"
}

# rollout_end: after verification passed, on a joined node (rollout_joined, called before the checks so that a
# failing one finds the EXIT trap set) this project cordoned: uncordon it and give its slot back. A failed
# verification exits first: rollout_cleanup gives the slot back and the node stays cordoned.
rollout_end() {
  ROLLOUT_SLOT="$(rollout_ours)"
  [[ -n "$ROLLOUT_SLOT" ]] || return 0
  rollout_kube uncordon "$ROLLOUT_NODE" >/dev/null
  rollout_kube annotate node "$ROLLOUT_NODE" "$ROLLOUT_ANNOTATION-" >/dev/null
  echo "rollout: uncordoned $ROLLOUT_NODE"
  slot_release
}
