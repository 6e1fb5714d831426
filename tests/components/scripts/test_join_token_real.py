"""A join's own token against a real kube-apiserver with bootstrap-token authentication on (kubeadm's manifest sets
``--enable-bootstrap-token-auth``): the Secret exactly as GuestBootstrap declares it (recorded under the mock engine,
with the join-token step's real output) is accepted by the API server, and the token then authenticates as kubeadm's
joining nodes do, until it expires (the authenticator checks ``expiration`` itself: kubernetes v1.34
plugin/pkg/auth/authenticator/token/bootstrap/bootstrap.go)."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from proxmox_gpu_cluster.render.join_token import minted
from tests.components.test_join_token import mint, standalone
from tests.kubeapi_real import RealCluster, real_cluster

__all__ = ["real_cluster"]  # the fixture, imported for pytest
pytestmark = pytest.mark.slow  # one real API server per process: about 10 s to start


def declared_secret(ttl: int) -> tuple[str, dict[str, Any]]:
    """The token the step printed (run for real, ``ttl`` seconds) and the Secret GuestBootstrap declares from it."""
    out = mint(ttl).stdout
    made = minted(out)
    assert made is not None, out
    inputs = standalone(None, out).named("bm1-join-token-secret").plain_inputs
    return made.token, {"apiVersion": "v1", "kind": "Secret", **inputs}


def whoami(cluster: RealCluster, token: str) -> subprocess.CompletedProcess[str]:
    """``kubectl auth whoami`` with ``token`` as the only credential."""
    return subprocess.run(
        [*cluster.command(), "--kubeconfig", "/dev/null", "--server", f"https://{cluster.server}",
         "--certificate-authority", str(cluster.root / "ca.crt"), "--token", token, "auth", "whoami", "-o", "json"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_the_declared_secret_makes_the_token_a_joining_nodes_credential(real_cluster: RealCluster) -> None:
    token, secret = declared_secret(3600)
    real_cluster.apply(secret)
    r = whoami(real_cluster, token)
    assert r.returncode == 0, r.stderr
    user = json.loads(r.stdout)["status"]["userInfo"]
    assert user["username"] == f"system:bootstrap:{token.split('.')[0]}"
    assert set(user["groups"]) == {"system:bootstrappers", "system:bootstrappers:kubeadm:default-node-token",
                                   "system:authenticated"}  # fmt: skip


def test_an_expired_token_is_refused(real_cluster: RealCluster) -> None:
    token, secret = declared_secret(-60)  # made a minute past its expiry: what a join an hour late holds
    real_cluster.apply(secret)
    r = whoami(real_cluster, token)
    assert r.returncode != 0 and "Unauthorized" in r.stderr, (r.returncode, r.stderr)


def test_another_token_of_the_same_id_is_refused(real_cluster: RealCluster) -> None:
    token, secret = declared_secret(3600)
    real_cluster.apply(secret)
    token_id = token.split(".")[0]
    forged = f"{token_id}.{'0' * 16}"
    assert forged != token
    r = whoami(real_cluster, forged)
    assert r.returncode != 0 and "Unauthorized" in r.stderr
