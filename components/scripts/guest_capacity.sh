#!/usr/bin/env bash
# The capacity gate, after the GPU stack is applied: this node advertises exactly what the plan's capacity table
# says (nvidia.com/gpu: 4, nvidia.com/mig-1g.5gb: 7, the KubeVirt resources, ...). Changes nothing. Sent after
# guest_lib.sh.
#
# Usage: guest_capacity.sh --node NAME --expect RESOURCE=COUNT [--expect ...] [--timeout SECONDS]
#                          [--interval SECONDS] [--device-plugin-config NAME]
# The gate is the node agent's capacity.py (see its docstring), run with the machine's python3: it reads the Node
# with kubelet's own credential (/etc/kubernetes/kubelet.conf), so no admin credential travels here, waits (bounded)
# until .status.allocatable holds every expected count, and prints "capacity: ok: ..." or fails naming the node,
# the expected and seen counts and the likely cause read from the node's labels.
set -euo pipefail
# shellcheck disable=SC2034 # read by die() in guest_lib.sh
STEP="capacity"
PGC_AGENT_DIR="${PGC_AGENT_DIR:-$(dirname "${BASH_SOURCE[0]:-.}")}"

main() {
  [[ -f "$PGC_AGENT_DIR/capacity.py" ]] || fail "node agent" "capacity.py in $PGC_AGENT_DIR" "none"
  python3 "$PGC_AGENT_DIR/capacity.py" --kubeconfig "$ROOT/etc/kubernetes/kubelet.conf" "$@" || exit
}

main "$@" </dev/null
