"""Make one kubeadm bootstrap token for one worker's join, at the moment the join is near: a token id and secret as
kubeadm makes them ([a-z0-9]{6} and [a-z0-9]{16}, from the OS's random source) and the time it expires, the first
argument (seconds) from now. Runs where ``pulumi up`` runs (a ``command.local.Command``, script on stdin, ``python3
- <seconds>``), right before the join; no credential and no network: the cluster's Kubernetes provider then creates
the token's Secret (``render/join_token.py``). Prints ``token=<id>.<secret>`` and ``expiration=<RFC 3339 UTC>``
(a secret output).
"""

import secrets
import string
import sys
from datetime import datetime, timedelta, timezone

ALPHABET = string.ascii_lowercase + string.digits


def pick(count: int) -> str:
    return "".join(secrets.choice(ALPHABET) for _ in range(count))


def main() -> int:
    seconds = int(sys.argv[1])
    # timezone.utc, not datetime.UTC (3.11): this runs on whatever python3 is where pulumi up runs.
    expiration = datetime.now(timezone.utc) + timedelta(seconds=seconds)  # noqa: UP017
    print(f"token={pick(6)}.{pick(16)}")
    print(f"expiration={expiration.strftime('%Y-%m-%dT%H:%M:%SZ')}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
