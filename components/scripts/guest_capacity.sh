#!/usr/bin/env bash
# The capacity gate, after the GPU stack is applied: this node advertises exactly what the plan's capacity table
# says (nvidia.com/gpu: 4, nvidia.com/mig-1g.5gb: 7, the KubeVirt resources, ...). Changes nothing. Sent after
# guest_lib.sh.
#
# Usage: guest_capacity.sh --node NAME --expect RESOURCE=COUNT [--expect ...] [--timeout SECONDS]
#                          [--interval SECONDS] [--device-plugin-config NAME]
# Reads the Node with kubelet's own credential (/etc/kubernetes/kubelet.conf): the Node authorizer lets a node
# read its own Node object, so no admin credential travels here. Waits until .status.allocatable holds every
# expected count (the device plugin restarts with a new config, MIG reconfigures, the operator labels the node),
# at most --timeout seconds. Prints "capacity: ok: ..." or fails with the node, the expected and seen counts and
# the likely cause read from the node's labels.
set -euo pipefail
# shellcheck disable=SC2034 # read by die() in guest_lib.sh
STEP="capacity"
KUBELET_CONF="/etc/kubernetes/kubelet.conf"
ERR_FILE=""

# Reads the Node JSON on stdin; argv: the device-plugin config the node should be labelled with (or ""), then
# RESOURCE=COUNT expectations. Prints "ok <seen>", "wait <seen>|<likely cause>" or, when waiting cannot help
# (MIG reconfiguration failed), "stop <seen>|<cause>".
CHECK='
import json, sys
node = json.load(sys.stdin)
want_config, expected = sys.argv[1], dict(e.split("=", 1) for e in sys.argv[2:])
allocatable = node.get("status", {}).get("allocatable", {})
labels = node.get("metadata", {}).get("labels", {})
seen = " ".join(f"{r}={allocatable.get(r, 0)}" for r in sorted(expected))
if all(str(allocatable.get(r, "0")) == n for r, n in expected.items()):
    print("ok", seen)
    sys.exit(0)
mig = labels.get("nvidia.com/mig.config.state", "")
config = labels.get("nvidia.com/device-plugin.config", "")
if mig == "failed":
    cause = ("the MIG configuration failed (nvidia.com/mig.config.state=failed, config "
             + labels.get("nvidia.com/mig.config", "?") + "): see the nvidia-mig-manager pod logs on this node")
elif mig in ("pending", "rebooting"):
    cause = f"MIG reconfiguration is {mig} (nvidia.com/mig.config.state): GPU pods may still hold the GPUs"
elif "nvidia.com/gpu.present" not in labels:
    cause = "the GPU Operator has not labelled this node yet (operator or Node Feature Discovery not ready)"
elif want_config and config != want_config:
    cause = f"the device-plugin config label is not applied (want {want_config}, seen {config or None})"
else:
    cause = "the device plugin has not advertised this configuration yet: see the nvidia-device-plugin pod on this node"
print("stop" if mig == "failed" else "wait", seen + "|" + cause)
'

main() {
  local node="" timeout=600 interval=10 config="" expects=()
  while (($#)); do
    case "$1" in
    --node) node="$2" ;;
    --expect) expects+=("$2") ;;
    --timeout) timeout="$2" ;;
    --interval) interval="$2" ;;
    --device-plugin-config) config="$2" ;;
    *) die "unknown argument $1" ;;
    esac
    shift 2
  done
  [[ "$node" =~ ^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$ ]] || fail "--node" "a node name" "'$node'"
  ((${#expects[@]})) || fail "arguments" "at least one --expect" "none"
  local e
  for e in "${expects[@]}"; do
    [[ "$e" =~ ^[a-z0-9.-]+/[A-Za-z0-9_.-]+=[0-9]{1,7}$ ]] || fail "--expect" "RESOURCE=COUNT" "'$e'"
  done
  [[ "$timeout" =~ ^[0-9]{1,5}$ && "$interval" =~ ^[1-9][0-9]{0,3}$ ]] ||
    fail "--timeout/--interval" "seconds" "'$timeout'/'$interval'"
  [[ -z "$config" || "$config" =~ ^[a-z0-9][a-z0-9.-]{0,62}$ ]] || fail "--device-plugin-config" "a name" "'$config'"
  [[ -s "$ROOT$KUBELET_CONF" ]] || fail "kubelet credential" "$KUBELET_CONF (the node has joined)" "no such file"

  # Polls counted, not clock time: at most timeout/interval pauses (plus kubectl's own 20 s per read).
  local pauses=$((timeout / interval)) json verdict seen="nothing read" cause="the API server did not answer"
  ERR_FILE="$(mktemp)"
  trap 'rm -f "$ERR_FILE"' EXIT
  while :; do
    if json="$(kubectl --kubeconfig "$ROOT$KUBELET_CONF" --request-timeout=20s get node "$node" -o json 2>"$ERR_FILE")"; then
      verdict="$(python3 -c "$CHECK" "$config" "${expects[@]}" <<<"$json")" ||
        fail "node $node" "its Node object as JSON" "unreadable output"
      if [[ "$verdict" == ok\ * ]]; then
        echo "capacity: ok: $node advertises ${verdict#ok }"
        return 0
      fi
      local final="${verdict%% *}"
      verdict="${verdict#* }"
      seen="${verdict%%|*}"
      cause="${verdict#*|}"
      [[ "$final" != stop ]] || fail "node $node allocatable" "${expects[*]}" "$seen; $cause"
    else
      cause="kubectl failed: $(tr '\n' ' ' <"$ERR_FILE")"
    fi
    if ((pauses-- <= 0)); then
      fail "node $node allocatable" "${expects[*]}" "$seen after ${timeout}s; likely: $cause"
    fi
    sleep "$interval"
  done
}

main "$@" </dev/null
