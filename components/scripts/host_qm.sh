#!/usr/bin/env bash
# qm's JSON answers, for the host steps that run a guest's installed step through the QEMU guest agent
# (retire_vm.sh, mig_restart.sh, vm_restart.sh; sent before them). `qm guest exec` prints one JSON object on stdout (out-data,
# err-data, exited, exitcode; on its own timeout only {"pid": N}, after a warning on stderr: qemu-server
# src/PVE/CLI/qm.pm, method exec). Perl's JSON::PP reads it: Proxmox VE is written in Perl, so every node has both.
set -euo pipefail

# qm_step_arg <flag> <value>: the arguments every VM step shares (--vmid, --node-name, --timeout, --guest-step),
# into vmid, node_name, timeout and guest_step; returns 1 for any other flag (the step's own, or an unknown one).
qm_step_arg() {
  case "$1" in
  --vmid) vmid="$2" ;;
  --node-name) node_name="$2" ;;
  --timeout) timeout="$2" ;;
  --guest-step) guest_step="$2" ;;
  *) return 1 ;;
  esac
}

# qm_step_checks <the guest's step, as its message names it> <the qm command that needs root>: the shared
# arguments' shapes (a script must not trust its arguments) and root; fails naming the first that is wrong.
qm_step_checks() {
  [[ "$vmid" =~ ^[0-9]{3,9}$ ]] || fail "--vmid" "a VM id" "'$vmid'"
  [[ "$node_name" =~ ^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$ ]] || fail "--node-name" "a DNS label" "'$node_name'"
  [[ "$timeout" =~ ^[0-9]{1,5}$ ]] || fail "--timeout" "seconds" "'$timeout'"
  [[ "$guest_step" =~ ^/[A-Za-z0-9._/-]+/step\.sh$ && "$guest_step" != *..* ]] ||
    fail "--guest-step" "the absolute path of the guest's installed $1" "'$guest_step'"
  [[ "$(id -u)" == 0 ]] || fail "user" "root ($2 is root-only)" "$(id -un)"
}

# qm_json_object <text>: whether the text is one JSON object.
qm_json_object() {
  perl -MJSON::PP -e 'exit(ref(eval { decode_json(do { local $/; <STDIN> }) }) eq "HASH" ? 0 : 1)' <<<"$1"
}

# qm_json_field <text> <field>: a field of that object (checked by qm_json_object first); empty when absent.
qm_json_field() {
  perl -MJSON::PP -e 'my $v = decode_json(do { local $/; <STDIN> })->{$ARGV[0]}; print defined $v ? $v : ""' \
    "$2" <<<"$1"
}

# qm_agent_up <vmid> <seconds>: wait (bounded) until the VM's QEMU guest agent answers.
qm_agent_up() {
  local waited=0
  until timeout 30 qm guest cmd "$1" ping >/dev/null 2>&1; do
    ((waited < $2)) || fail "guest agent" "VM $1's QEMU guest agent answering within ${2}s" "no answer"
    sleep 5
    waited=$((waited + 5))
  done
}

# qm_guest_step <vmid> <seconds> <what> <installed step.sh> <args...>: run the guest's installed step through the
# guest agent and its launcher (PGC_LAUNCHER), show its output, and set QM_OUT and QM_CODE (its stdout and exit
# code); fails when qm cannot start it, answers no JSON object, or the step is still running after <seconds>.
# QM_ERR_FILE: a file for qm's stderr (on a timeout qm warns there and still exits 0, printing {"pid": N}).
qm_guest_step() {
  local vmid="$1" seconds="$2" what="$3" result err warning
  shift 3
  result="$(qm guest exec "$vmid" --timeout "$seconds" -- bash -c "$PGC_LAUNCHER" "$@" 2>"$QM_ERR_FILE")" ||
    fail "qm guest exec" "the guest's $what started in VM $vmid" "$(tr '\n' ' ' <"$QM_ERR_FILE")"
  warning="$(tr '\n' ' ' <"$QM_ERR_FILE")"
  qm_json_object "$result" ||
    fail "qm guest exec" "a JSON object on stdout from VM $vmid" "'${result//$'\n'/ }' (stderr: ${warning:-nothing})"
  QM_OUT="$(qm_json_field "$result" out-data)"
  err="$(qm_json_field "$result" err-data)"
  [[ -z "$QM_OUT" ]] || printf '%s\n' "$QM_OUT"
  [[ -z "$err" ]] || printf '%s\n' "$err" >&2
  [[ "$(qm_json_field "$result" exited)" == 1 ]] ||
    fail "guest exec" "the guest's $what to finish within ${seconds}s" \
      "it still runs in VM $vmid (pid $(qm_json_field "$result" pid); qm: ${warning:-nothing})"
  # shellcheck disable=SC2034 # read by the step that called it
  QM_CODE="$(qm_json_field "$result" exitcode)"
}

# qm_guest_arg <flag> <default> <guest args...>: the value the guest step's arguments give <flag>, else <default>.
qm_guest_arg() {
  local flag="$1" value="$2" i
  shift 2
  local args=("$@")
  for ((i = 0; i + 1 < ${#args[@]}; i++)); do
    [[ "${args[i]}" != "$flag" ]] || value="${args[i + 1]}"
  done
  printf '%s\n' "$value"
}

# qm_hold_seconds <guest args...>: QM_HOLD_SECONDS, how long the guest's hold of its node may take: a rollout slot,
# waited for up to --rollout-wait-seconds, and the drain, up to --rollout-drain-timeout (given only when not at their
# defaults, guest_rollout.sh's). A variable, not output: a check failing inside a command substitution would be
# named twice.
qm_hold_seconds() {
  local slot_wait drain_timeout
  slot_wait="$(qm_guest_arg --rollout-wait-seconds 21600 "$@")"
  drain_timeout="$(qm_guest_arg --rollout-drain-timeout 600 "$@")"
  [[ "$slot_wait" =~ ^[0-9]{1,6}$ && "$drain_timeout" =~ ^[0-9]{1,6}$ ]] ||
    fail "guest arguments" "--rollout-wait-seconds and --rollout-drain-timeout SECONDS" "'$slot_wait' '$drain_timeout'"
  # shellcheck disable=SC2034 # read by the step that called it
  QM_HOLD_SECONDS=$((slot_wait + drain_timeout))
}
