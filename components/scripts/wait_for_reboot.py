"""Wait for a Proxmox node to go down and come back after host prep scheduled a reboot.

Runs where ``pulumi up`` runs (a ``command.local.Command``, script on stdin, ``python3 -``): a remote command
cannot wait for its own host to reboot. Settings come from the environment: PGC_HOST, PGC_PORT (SSH port),
PGC_PREP_OUTPUT (host prep's stdout; nothing to wait for unless it says "reboot: scheduled"),
PGC_DOWN_TIMEOUT and PGC_UP_TIMEOUT (seconds). Exits 1 with a message naming the step on timeout.
"""

import os
import socket
import sys
import time


def reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=3):
            return True
    except OSError:
        return False


def wait(host: str, port: int, want_up: bool, timeout: float, interval: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if reachable(host, port) == want_up:
            return True
        time.sleep(interval)
    return False


def main() -> int:
    if "reboot: scheduled" not in os.environ.get("PGC_PREP_OUTPUT", ""):
        print("reboot: not needed")
        return 0
    host, port = os.environ["PGC_HOST"], int(os.environ.get("PGC_PORT", "22"))
    interval = float(os.environ.get("PGC_INTERVAL", "2"))
    if not wait(host, port, False, float(os.environ.get("PGC_DOWN_TIMEOUT", "180")), interval):
        print(
            f"wait-for-reboot: down: {host}:{port} still answers; the scheduled reboot did not happen", file=sys.stderr
        )
        return 1
    if not wait(host, port, True, float(os.environ.get("PGC_UP_TIMEOUT", "900")), interval):
        print(f"wait-for-reboot: up: {host}:{port} did not answer again in time", file=sys.stderr)
        return 1
    print(f"reboot: {host} is back")
    return 0


if __name__ == "__main__":
    sys.exit(main())
