"""wait_for_reboot.py against a real local TCP listener that goes away and comes back."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

from tests.components.scripts.fakeroot import SCRIPTS

SCRIPT = (SCRIPTS / "wait_for_reboot.py").read_text()


def run(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {"PATH": os.environ["PATH"], "PGC_INTERVAL": "0.05"}
    return subprocess.run([sys.executable, "-"], input=SCRIPT, env={**base, **env}, capture_output=True, text=True,
                          check=False, timeout=30)  # fmt: skip


def listener(port: int = 0) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen()
    return s


def test_no_reboot_no_wait() -> None:
    r = run({"PGC_PREP_OUTPUT": "changed: nothing\nreboot: not-needed\n", "PGC_HOST": "192.0.2.1"})
    assert r.returncode == 0 and r.stdout == "reboot: not needed\n"


def test_waits_for_down_then_up() -> None:
    s = listener()
    port = s.getsockname()[1]

    def reboot() -> None:
        time.sleep(0.3)
        s.close()  # the host goes down
        time.sleep(0.5)
        back = listener(port)  # and comes back
        time.sleep(2)
        back.close()

    t = threading.Thread(target=reboot)
    t.start()
    r = run({"PGC_PREP_OUTPUT": "reboot: scheduled\n", "PGC_HOST": "127.0.0.1", "PGC_PORT": str(port)})
    t.join()
    assert r.returncode == 0, r.stderr
    assert r.stdout == "reboot: 127.0.0.1 is back\n"


def test_a_wait_run_again_after_the_reboot_happened_converges() -> None:
    # The reboot happened while nothing waited (an interrupted pulumi up); the next up runs the wait again: the
    # machine answers throughout, which is no failure (the steps after it check what the reboot did).
    s = listener()
    try:
        r = run({"PGC_PREP_OUTPUT": "reboot: scheduled\n", "PGC_HOST": "127.0.0.1",
                 "PGC_PORT": str(s.getsockname()[1]), "PGC_DOWN_TIMEOUT": "0.5"})  # fmt: skip
    finally:
        s.close()
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("reboot: 127.0.0.1:") and "rebooted before this wait ran" in r.stdout


def test_host_that_never_comes_back_fails_the_step() -> None:
    s = listener()
    port = s.getsockname()[1]
    s.close()
    r = run({"PGC_PREP_OUTPUT": "reboot: scheduled\n", "PGC_HOST": "127.0.0.1", "PGC_PORT": str(port),
             "PGC_UP_TIMEOUT": "0.5"})  # fmt: skip
    assert r.returncode == 1
    assert r.stderr == f"wait-for-reboot: up: expected 127.0.0.1:{port} to answer again within 0.5s, saw no answer\n"
