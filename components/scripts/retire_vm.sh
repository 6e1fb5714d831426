#!/usr/bin/env bash
# Retire a worker VM's Kubernetes node before the VM is destroyed or replaced. Runs on the VM's Proxmox node as
# root and reaches the guest through the QEMU guest agent (`qm guest exec`), not over the network: a guest that
# no longer answers cannot block the destroy. Then the node is not drained, and a warning says so and what to do.
#
# Usage: retire_vm.sh --vmid N --node-name NAME --timeout SECONDS --guest-step PATH [--check 0|1] -- GUEST-ARGS...
# The work runs in the guest: the node agent's drain step installed there (PATH, absolute, in the guest), started by
# the QEMU guest agent. It acts as the node itself (kubelet's credential in the guest): no credential passes here.
# --check 1 (the create step) only proves the agent answers and the drain step is installed, so a later retire will
# reach it.
set -euo pipefail

vmid="" node_name="" timeout="" guest_step="" check=0 guest_args=()
while (($#)); do
  case "$1" in
  --vmid) vmid="$2" ;;
  --node-name) node_name="$2" ;;
  --timeout) timeout="$2" ;;
  --check) check="$2" ;;
  --guest-step) guest_step="$2" ;;
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
  [[ "$guest_step" =~ ^/[A-Za-z0-9._/-]+/step\.sh$ && "$guest_step" != *..* ]] ||
    fail "--guest-step" "the absolute path of the guest's installed drain step" "'$guest_step'"
  [[ "$(id -u)" == 0 ]] || fail "user" "root (qm guest exec is root-only)" "$(id -un)"
  local status result code installed
  status="$(qm status "$vmid" 2>&1)" || warn_and_leave "VM $vmid is not on this node (${status//$'\n'/ })"
  [[ "$status" == *"status: running"* ]] || warn_and_leave "VM $vmid is not running (${status//$'\n'/ })"
  timeout 30 qm guest cmd "$vmid" ping >/dev/null 2>&1 || warn_and_leave "VM $vmid's guest agent does not answer"
  installed="$(timeout 60 qm guest exec "$vmid" --timeout 30 -- test -f "$guest_step" 2>&1)" ||
    warn_and_leave "qm guest exec on VM $vmid failed"
  if [[ "$(json_field exitcode <<<"$installed")" != 0 ]]; then
    # The guest's agent copy lacks this drain step (a copy that failed or was removed by hand).
    warn_and_leave "the node agent's drain step $guest_step is not installed in VM $vmid"
  fi
  if ((check)); then
    echo "retire: ready: VM $vmid ($node_name) answers through its guest agent and has its drain step"
    return 0
  fi
  # The agent's own limit comes after the drain's, so the guest reports a drain timeout itself.
  result="$(qm guest exec "$vmid" --timeout "$((timeout + 180))" -- bash "$guest_step" "${guest_args[@]}")" ||
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
