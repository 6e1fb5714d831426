#!/usr/bin/env bash
# qm's JSON answers, for the host steps that run a guest's installed step through the QEMU guest agent
# (retire_vm.sh, mig_restart.sh; sent before them). `qm guest exec` prints one JSON object on stdout (out-data,
# err-data, exited, exitcode; on its own timeout only {"pid": N}, after a warning on stderr: qemu-server
# src/PVE/CLI/qm.pm, method exec). Perl's JSON::PP reads it: Proxmox VE is written in Perl, so every node has both.
set -euo pipefail

# qm_json_object <text>: whether the text is one JSON object.
qm_json_object() {
  perl -MJSON::PP -e 'exit(ref(eval { decode_json(do { local $/; <STDIN> }) }) eq "HASH" ? 0 : 1)' <<<"$1"
}

# qm_json_field <text> <field>: a field of that object (checked by qm_json_object first); empty when absent.
qm_json_field() {
  perl -MJSON::PP -e 'my $v = decode_json(do { local $/; <STDIN> })->{$ARGV[0]}; print defined $v ? $v : ""' \
    "$2" <<<"$1"
}
