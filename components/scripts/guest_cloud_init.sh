#!/usr/bin/env bash
# Step 1 of the guest bootstrap: the host is Ubuntu 22.04 or 24.04 and cloud-init has finished (apt and dpkg are
# free again, the vendor data's nouveau blacklist is in place). Changes nothing. Sent after guest_lib.sh.
set -euo pipefail
# shellcheck disable=SC2034 # read by die() in guest_lib.sh
STEP="cloud-init"

main() {
  local id="" version="" rc=0 status
  guest_begin
  if [[ -r "$ROOT/etc/os-release" ]]; then
    # shellcheck source=/dev/null # the host's os-release, not part of this project
    id="$(. "$ROOT/etc/os-release" && printf '%s' "${ID:-}")"
    # shellcheck source=/dev/null
    version="$(. "$ROOT/etc/os-release" && printf '%s' "${VERSION_ID:-}")"
  fi
  case "$id $version" in
  "ubuntu 22.04" | "ubuntu 24.04") ;;
  *) fail "operating system" "Ubuntu 22.04 or 24.04" "'$id $version'" ;;
  esac
  if ! command -v cloud-init >/dev/null; then
    echo "cloud-init: not installed"
    return 0
  fi
  # Exit codes: 0 done, 2 done with recoverable errors (cloud-init 23.4+), anything else failed.
  status="$(cloud-init status --wait 2>&1)" || rc=$?
  case "$rc" in
  0) echo "cloud-init: done" ;;
  2) echo "cloud-init: done with recoverable errors (see /var/log/cloud-init.log)" ;;
  *) fail "cloud-init status --wait" "done" "exit $rc: $(tail -n 1 <<<"$status")" ;;
  esac
}

main "$@" </dev/null
