#!/usr/bin/env bash
# Retire a worker VM's Kubernetes node before the VM is destroyed or replaced. Runs on the VM's Proxmox node as
# root and reaches the guest through the QEMU guest agent (`qm guest exec`), not over the network: a guest that
# no longer answers cannot block the destroy. Then the node is not drained, and a warning says so and what to do.
#
# Usage: retire_vm.sh --vmid N --node-name NAME --timeout SECONDS [--check 0|1] -- GUEST-ARGS...
# Stdin starts with two shell assignments: PGC_KUBECONFIG (the admin kubeconfig, a secret) and PGC_GUEST_SCRIPT
# (guest_lib.sh + guest_drain.sh). Both reach the guest on the agent's stdin, never as arguments or environment,
# with the node agent's cluster.py as PGC_AGENT_CLUSTER_PY (the drain's logic, which a guest set up before the agent
# existed does not have): the same assignment on this script's stdin, else the file next to this script.
# --check 1 (the create step) only proves the agent answers, so a later retire will reach the guest.
set -euo pipefail
PGC_AGENT_DIR="${PGC_AGENT_DIR:-$(dirname "${BASH_SOURCE[0]:-.}")}"

vmid="" node_name="" timeout="" check=0 guest_args=()
while (($#)); do
  case "$1" in
  --vmid) vmid="$2" ;;
  --node-name) node_name="$2" ;;
  --timeout) timeout="$2" ;;
  --check) check="$2" ;;
  --)
    shift
    guest_args=("$@")
    break
    ;;
  *)
    echo "retire: arguments: unknown argument $1" >&2
    exit 1
    ;;
  esac
  shift 2
done

fail() {
  echo "retire: $1: expected $2, saw $3" >&2
  exit 1
}

# warn_and_leave: the guest cannot be reached. At create time that is an error; at destroy time the VM goes
# anyway (it is already down or unreachable), and the warning says what is left behind.
warn_and_leave() {
  if ((check)); then
    fail "guest agent" "VM $vmid ($node_name) running with a QEMU guest agent that answers" "$1"
  fi
  echo "retire: warning: $1: $node_name was not drained and its Node object stays (NotReady);" \
    "delete it with: kubectl delete node $node_name"
  exit 0
}

# json_field <field>: a field of the JSON object on stdin (qm guest exec prints one); empty when absent.
json_field() {
  perl -MJSON::PP -e 'my $r = decode_json(do { local $/; <STDIN> }); my $v = $r->{$ARGV[0]};
    print defined $v ? $v : ""' "$1"
}

main() {
  [[ "$vmid" =~ ^[0-9]{3,9}$ ]] || fail "--vmid" "a VM id" "'$vmid'"
  [[ "$node_name" =~ ^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$ ]] || fail "--node-name" "a DNS label" "'$node_name'"
  [[ "$timeout" =~ ^[0-9]{1,5}$ ]] || fail "--timeout" "seconds" "'$timeout'"
  [[ "$(id -u)" == 0 ]] || fail "user" "root (qm guest exec is root-only)" "$(id -un)"
  local status result code agent="${PGC_AGENT_CLUSTER_PY:-}"
  status="$(qm status "$vmid" 2>&1)" || warn_and_leave "VM $vmid is not on this node (${status//$'\n'/ })"
  [[ "$status" == *"status: running"* ]] || warn_and_leave "VM $vmid is not running (${status//$'\n'/ })"
  timeout 30 qm guest cmd "$vmid" ping >/dev/null 2>&1 || warn_and_leave "VM $vmid's guest agent does not answer"
  if ((check)); then
    echo "retire: ready: VM $vmid ($node_name) answers through its guest agent"
    return 0
  fi
  [[ -n "$agent" || ! -f "$PGC_AGENT_DIR/cluster.py" ]] || agent="$(cat "$PGC_AGENT_DIR/cluster.py")"
  # The agent's own limit comes after the drain's, so the guest reports a drain timeout itself.
  result="$({
    printf 'PGC_KUBECONFIG=%q\n' "${PGC_KUBECONFIG:-}"
    printf 'PGC_AGENT_CLUSTER_PY=%q\n' "$agent"
    printf '%s\n' "${PGC_GUEST_SCRIPT:-}"
  } | qm guest exec "$vmid" --pass-stdin 1 --timeout "$((timeout + 180))" -- bash -s -- "${guest_args[@]}")" ||
    warn_and_leave "qm guest exec on VM $vmid failed"
  local out err
  out="$(json_field out-data <<<"$result")"
  err="$(json_field err-data <<<"$result")"
  [[ -z "$out" ]] || printf '%s\n' "$out"
  [[ -z "$err" ]] || printf '%s\n' "$err" >&2
  [[ "$(json_field exited <<<"$result")" == 1 ]] ||
    fail "guest exec" "the retire step to finish within $((timeout + 180))s" "it still runs in VM $vmid"
  code="$(json_field exitcode <<<"$result")"
  [[ "$code" == 0 ]] || fail "guest" "exit code 0 from the retire step in VM $vmid" "$code (its message is above)"
}

main "$@" </dev/null
