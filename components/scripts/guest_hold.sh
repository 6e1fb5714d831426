#!/usr/bin/env bash
# Take a joined node out of service for a change made to it from outside: its rollout slot, cordon and drain
# (guest_rollout.sh), before the Proxmox node restarts its VM to apply pending hardware (vm_restart.sh runs this
# step through the QEMU guest agent). The verify step after the restart uncordons it and gives the slot back; a run
# that fails leaves it as guest_rollout.sh says. A node that has not joined yet has nothing to hold.
# Sent after guest_lib.sh and guest_rollout.sh.
#
# Usage: guest_hold.sh --why TEXT --rollout 1 --rollout-node NAME --rollout-api HOST:PORT [...]
# Prints "hold: <node> held (<why>)" or "hold: not joined: nothing to hold".
set -euo pipefail
# shellcheck disable=SC2034 # read by die() in guest_lib.sh
STEP="hold"

why=""
while (($#)); do
  case "$1" in
  --why) why="$2" ;;
  *) rollout_arg "$1" "$2" || die "unknown argument $1" ;;
  esac
  shift 2
done
[[ "$why" =~ ^[A-Za-z0-9][-A-Za-z0-9\ .,:=_]{0,119}$ ]] || fail "--why" "a short reason" "'${why:0:40}'"
rollout_check_args

main() {
  guest_begin
  if rollout_joined; then
    rollout_begin "$why"
    echo "hold: $ROLLOUT_NODE held ($why)"
  else
    echo "hold: not joined: nothing to hold"
  fi
}

main "$@" </dev/null
