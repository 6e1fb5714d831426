#!/usr/bin/env bash
# Retire a worker VM's Kubernetes node before the VM is destroyed or replaced. Runs on the VM's Proxmox node as
# root and reaches the guest through the QEMU guest agent (`qm guest exec`), not over the network.
#
# Usage: retire_vm.sh --vmid N --node-name NAME --timeout SECONDS --guest-step PATH [--check 0|1] -- GUEST-ARGS...
# The work runs in the guest: the node agent's drain step installed there (PATH, absolute, in the guest), started by
# the QEMU guest agent through the agent's launcher (PGC_LAUNCHER, render/agent_bundle.py: the store's bundle, never
# a copy being rewritten). It acts as the node itself (kubelet's credential in the guest): no credential passes here.
# --check 1 (the create step) only proves the agent answers and the drain step is installed, so a later retire will
# reach it.
#
# When the drain may be skipped: only when qm itself says the guest is gone: the VM is stopped or no longer on this
# node, it has no guest agent configured, or its agent is not running on any of the tries below (qemu-server's
# PVE::QemuServer::Agent assert_agent_available: "VM <id> is not running", "No QEMU guest agent configured",
# "QEMU guest agent is not running"). Then the VM goes with a warning naming what is left (its Node object). Any
# other qm failure (pmxcfs or the QMP socket busy, a timeout) is tried again, ATTEMPTS times in all, and then fails
# the step in one line: a VM is never destroyed with its pods on it because one qm call failed. Sent after
# host_qm.sh.
set -euo pipefail

vmid="" node_name="" timeout="" guest_step="" check=0 guest_args=()
while (($#)); do
  case "$1" in
  --check) check="$2" ;;
  --)
    shift
    guest_args=("$@")
    break
    ;;
  *)
    if ! qm_step_arg "$1" "${2-}"; then
      echo "retire: arguments: unknown argument $1" >&2
      exit 1
    fi
    ;;
  esac
  shift 2
done

ATTEMPTS=5 # each qm call, 10 s apart: a pmxcfs restart or a busy QMP socket passes within that
QM_OUT="" QM_ERR="" ERR_FILE=""

fail() {
  echo "retire: $1: expected $2, saw $3" >&2
  exit 1
}

# one_line <text>: text on one line (qm's messages span lines).
one_line() {
  local text="${1//$'\n'/ }"
  printf '%s' "${text:-nothing}"
}

# gone <why>: qm says the guest cannot run the drain. At create time that is an error; at destroy time the VM goes
# anyway, and the warning says what is left behind.
gone() {
  if ((check)); then
    fail "guest agent" "VM $vmid ($node_name) running with a QEMU guest agent that answers" "$1"
  fi
  echo "retire: warning: $1: $node_name was not drained and its Node object stays (NotReady);" \
    "delete it with: kubectl delete node $node_name"
  exit 0
}

# qm_call <seconds> <qm args...>: run qm, stdout in QM_OUT, stderr in QM_ERR (kept apart: `qm guest exec` warns
# on stderr and prints its JSON on stdout, both with exit 0). Tried again while the failure may pass; returns 0,
# or 3 when qm says the guest is gone (qm's reason in QM_ERR); fails the step once the tries are used up.
qm_call() {
  local limit="$1" try rc what="qm $2"
  shift
  [[ "$1" != guest ]] || what+=" $2"
  for ((try = 1; ; try++)); do
    rc=0
    QM_OUT="$(timeout "$limit" qm "$@" 2>"$ERR_FILE")" || rc=$?
    QM_ERR="$(cat "$ERR_FILE")"
    ((rc != 0)) || return 0
    case "$QM_ERR" in
    *"is not running"* | *"No QEMU guest agent configured"* | *"does not exist"*)
      # "QEMU guest agent is not running" may be an agent restarting: gone only when it stays so.
      [[ "$QM_ERR" == *"QEMU guest agent is not running"* ]] && ((try < ATTEMPTS)) || return 3
      ;;
    esac
    ((try < ATTEMPTS)) || fail "$what on VM $vmid" "an answer (tried $ATTEMPTS times)" \
      "$( ((rc == 124)) && echo "no answer within ${limit}s" || echo "exit $rc: $(one_line "$QM_ERR")")"
    echo "retire: $what on VM $vmid failed (exit $rc: $(one_line "$QM_ERR")); trying again in 10 s"
    sleep 10
  done
}

# json_object: qm's stdout (QM_OUT) is the JSON object qm prints, or the step fails in one line.
json_object() {
  qm_json_object "$QM_OUT" ||
    fail "qm guest exec on VM $vmid" "a JSON object on stdout" "'$(one_line "$QM_OUT")' (stderr: $(one_line "$QM_ERR"))"
}

# json_field <field>: a field of qm's JSON object (QM_OUT, checked by json_object); empty when absent.
json_field() {
  qm_json_field "$QM_OUT" "$1"
}

main() {
  [[ "$check" == [01] ]] || fail "--check" "0 or 1" "'$check'"
  qm_step_checks "drain step" "qm guest exec"
  local code pid out err run_for=$((timeout + 180))
  ERR_FILE="$(mktemp)"
  trap 'rm -f "$ERR_FILE"' EXIT
  qm_call 30 status "$vmid" || gone "VM $vmid is not on this node ($(one_line "$QM_ERR"))"
  [[ "$QM_OUT" == *"status: running"* ]] || {
    [[ "$QM_OUT" == *"status: stopped"* ]] || fail "VM $vmid" "running or stopped" "$(one_line "$QM_OUT")"
    gone "VM $vmid is not running ($(one_line "$QM_OUT"))"
  }
  qm_call 30 guest cmd "$vmid" ping || gone "VM $vmid's guest agent does not answer ($(one_line "$QM_ERR"))"
  qm_call 60 guest exec "$vmid" --timeout 30 -- test -f "$guest_step" ||
    gone "VM $vmid's guest agent does not answer ($(one_line "$QM_ERR"))"
  json_object
  [[ "$(json_field exited)" == 1 ]] ||
    fail "qm guest exec on VM $vmid" "test -f to finish within 30s" "$(one_line "$QM_ERR")"
  if [[ "$(json_field exitcode)" != 0 ]]; then
    # The guest's agent copy lacks this drain step (a copy that failed or was removed by hand): qm answered, so
    # this is no passing failure; the destroy goes on with the warning.
    gone "the node agent's drain step $guest_step is not installed in VM $vmid"
  fi
  if ((check)); then
    echo "retire: ready: VM $vmid ($node_name) answers through its guest agent and has its drain step"
    return 0
  fi
  # The agent's own limit comes after the drain's, so the guest reports a drain timeout itself. The drain is
  # idempotent and takes the guest's step lock, so a try after a failed qm call is safe.
  qm_call $((run_for + 60)) guest exec "$vmid" --timeout "$run_for" -- \
    bash -c "$PGC_LAUNCHER" "$guest_step" "${guest_args[@]}" ||
    gone "VM $vmid's guest agent stopped answering during the drain ($(one_line "$QM_ERR"))"
  json_object
  out="$(json_field out-data)"
  err="$(json_field err-data)"
  [[ -z "$out" ]] || printf '%s\n' "$out"
  [[ -z "$err" ]] || printf '%s\n' "$err" >&2
  if [[ "$(json_field exited)" != 1 ]]; then
    # qm.pm on timeout: "timeout reached, returning pid" on stderr, {"pid": N} on stdout, exit 0.
    pid="$(json_field pid)"
    fail "guest exec" "the retire step to finish within ${run_for}s" "it still runs in VM $vmid (pid ${pid:-?})"
  fi
  code="$(json_field exitcode)"
  [[ "$code" == 0 ]] || fail "guest" "exit code 0 from the retire step in VM $vmid" "$code (its message is above)"
}

main "$@" </dev/null
