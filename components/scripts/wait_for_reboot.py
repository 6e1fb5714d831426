"""Wait for a machine to go down and come back after a step (host prep, the guest's driver) scheduled a reboot.

Runs where ``pulumi up`` runs (a ``command.local.Command``, script on stdin, ``python3 -``): a remote command
cannot wait for its own host to reboot. Settings come from the environment: PGC_HOST, PGC_PORT (SSH port),
PGC_PREP_OUTPUT (the step's stdout; nothing to wait for unless it says "reboot: scheduled"),
PGC_DOWN_TIMEOUT and PGC_UP_TIMEOUT (seconds).

It converges like the steps: run again after an interrupted ``pulumi up`` (the reboot happened while nothing was
waiting), the machine never goes down, and that is no failure: it says so and only waits for the machine to answer.
Whether a reboot did what it was for is for the steps after it to check (verify, host verify), and the scheduling
step itself records the boot it scheduled from. Exits 1 only when the machine does not answer again in time.
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
    down_timeout = float(os.environ.get("PGC_DOWN_TIMEOUT", "180"))
    if not wait(host, port, False, down_timeout, interval):
        print(
            f"reboot: {host}:{port} kept answering for {down_timeout:g}s: it rebooted before this wait ran (an "
            "interrupted pulumi up) or not at all; the next steps check which"
        )
        return 0
    up_timeout = float(os.environ.get("PGC_UP_TIMEOUT", "900"))
    if not wait(host, port, True, up_timeout, interval):
        print(
            f"wait-for-reboot: up: expected {host}:{port} to answer again within {up_timeout:g}s, saw no answer",
            file=sys.stderr,
        )
        return 1
    print(f"reboot: {host} is back")
    return 0


if __name__ == "__main__":
    sys.exit(main())
