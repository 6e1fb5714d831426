"""A join's own bootstrap token: the step's script and output (``render/join_token.py``, ``join_token.py``), and
where the step and the token's Secret sit in a worker's chain under the mock engine (right before the join, the
token secret throughout, nothing of the cluster's credential in either). The Secret against a real API server:
tests/components/scripts/test_join_token_real.py."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import pulumi
import pulumi_command as command
import pulumi_kubernetes as kubernetes
import pytest

from proxmox_gpu_cluster.errors import InvalidComponentArgs
from proxmox_gpu_cluster.guest.guest_bootstrap import GuestBootstrap, GuestBootstrapArgs
from proxmox_gpu_cluster.render.host_scripts import script
from proxmox_gpu_cluster.render.join_token import MintedToken, mint_command, minted
from proxmox_gpu_cluster.testing import Recording, RecordingMocks, is_secret, redact, run
from tests.components.test_guest_bootstrap import STANDALONE
from tests.support import SECRETS, base_spec, plan_stack

LOCAL = "command:local:Command"
SECRET = "kubernetes:core/v1:Secret"


def mint(ttl: int = 3600) -> subprocess.CompletedProcess[str]:
    """The step as pulumi-command runs it: ``/bin/sh -c <create>``, the script on stdin."""
    return subprocess.run(
        ["/bin/sh", "-c", mint_command(ttl).replace("python3", sys.executable, 1)],
        input=script("join_token.py"), capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip


def test_the_step_prints_a_token_in_kubeadms_shape_and_its_expiry() -> None:
    before = datetime.now(UTC).replace(microsecond=0)
    out = mint().stdout
    made = minted(out)
    assert made is not None, out
    assert len(made.token_id) == 6 and len(made.token_secret) == 16
    expires = datetime.strptime(made.expiration, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    assert before + timedelta(seconds=3600) <= expires <= datetime.now(UTC) + timedelta(seconds=3600)
    assert minted(mint().stdout) != made  # a new one each run


def test_anything_else_is_no_token() -> None:
    good = "token=abcdef.0123456789abcdef\nexpiration=2026-11-28T16:00:00Z\n"
    assert minted(good) == MintedToken("abcdef", "0123456789abcdef", "2026-11-28T16:00:00Z")
    for bad in (None, "", good.upper(), good.replace("abcdef.", "abcde."), "x" + good, good + "more\n"):
        assert minted(bad) is None, bad


def test_the_secret_is_what_kubeadm_token_create_writes() -> None:
    made = MintedToken("abcdef", "0123456789abcdef", "2026-11-28T16:00:00Z")
    assert made.token == "abcdef.0123456789abcdef" and made.secret_name == "bootstrap-token-abcdef"
    data = made.fields("gpu-1")
    assert made.data("gpu-1") == {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    assert data["auth-extra-groups"] == "system:bootstrappers:kubeadm:default-node-token"
    assert (data["usage-bootstrap-authentication"], data["usage-bootstrap-signing"]) == ("true", "true")
    assert (data["token-id"], data["token-secret"], data["expiration"]) == ("abcdef", "0123456789abcdef",
                                                                           "2026-11-28T16:00:00Z")  # fmt: skip
    assert "gpu-1" in data["description"]


def standalone(token: str | None, stdout: str) -> Recording:
    mocks = RecordingMocks(resource_outputs={LOCAL: lambda a: {"stdout": stdout} if a.name.endswith("-join-token")
                                             else {}})  # fmt: skip

    def program() -> None:
        args = GuestBootstrapArgs(
            bootstrap=STANDALONE, host="10.0.0.21", user="root", ssh_private_key="k", join_token=token,
            ca_cert_hash="sha256:" + "0" * 64,
        )  # fmt: skip
        cmd, kube = command.Provider("cmd"), kubernetes.Provider("kube", kubeconfig="KUBECONFIG-CANARY")
        GuestBootstrap("bm1", args, pulumi.ResourceOptions(providers=[cmd, kube]))

    return run(program, mocks=mocks, preview=False)


def test_without_a_token_the_join_waits_for_its_own_token_and_its_secret() -> None:
    out = mint().stdout
    made = minted(out)
    assert made is not None
    rec = standalone(None, out)
    step, stored, runtime, join = (
        rec.named(f"bm1-{r}") for r in ("join-token", "join-token-secret", "runtime", "join")
    )
    assert step.type == LOCAL and stored.type == SECRET
    assert {step.parent, stored.parent} == {rec.named("bm1").urn}
    assert runtime.urn in step.dependencies and step.urn in stored.dependencies and stored.urn in join.dependencies
    assert stored.provider is not None and stored.provider.endswith("$pulumi:providers:kubernetes::kube")
    assert step.provider is not None and step.provider.endswith("$pulumi:providers:command::cmd")
    assert step.plain_inputs["create"] == "python3 - 3600" and step.plain_inputs["stdin"] == script("join_token.py")
    assert step.plain_inputs["logging"] == "none" and step.plain_inputs["addPreviousOutputInEnv"] is False
    assert set(step.additional_secret_outputs) >= {"stdout", "stderr"}
    assert stored.plain_inputs["metadata"] == {"name": made.secret_name, "namespace": "kube-system"}
    assert stored.plain_inputs["type"] == "bootstrap.kubernetes.io/token"
    assert is_secret(stored.inputs["data"]) and made.token_secret not in json.dumps(redact(stored.inputs))
    assert stored.plain_inputs["data"] == made.data("bare-metal-1") and "stringData" not in stored.inputs
    name, value = join.plain_inputs["stdin"].splitlines()[0].split("=", 1)
    assert (name, base64.b64decode(value).decode()) == ("PGC_JOIN_TOKEN", made.token)
    assert is_secret(join.inputs["stdin"])
    assert "KUBECONFIG-CANARY" not in json.dumps([r.plain_inputs for r in rec.resources if r.name.startswith("bm1")])


def test_a_stored_token_makes_none_and_only_the_ca_hash_is_required() -> None:
    assert [r.name for r in standalone("abcdef.0123456789abcdef", "").resources if "token" in r.name] == []
    with pytest.raises(InvalidComponentArgs) as err:
        GuestBootstrapArgs(bootstrap=STANDALONE, host="h", user="root", ssh_private_key="k")
    assert err.value.lines == ["GuestBootstrapArgs.ca_cert_hash: join method kubeadm (bootstrap.join_method) needs it"]


def test_a_stack_without_kubeadm_join_token_makes_one_per_worker_through_its_kubernetes_provider() -> None:
    rec = plan_stack(base_spec(), secrets={k: v for k, v in SECRETS.items() if k != "kubeadmJoinToken"})
    workers = ("mig-1", "mig-2", "ts-1")
    stored = [rec.named(f"cluster-{w}-bootstrap-join-token-secret") for w in workers]
    provider = rec.named("cluster-kubernetes")
    assert all(s.provider is not None and s.provider.startswith(provider.urn) for s in stored)
    steps: list[Any] = [rec.named(f"cluster-{w}-bootstrap-join-token") for w in workers]
    assert all(s.type == LOCAL for s in steps)
    # With the secret set, none.
    assert not [r for r in plan_stack(base_spec()).resources if r.name.endswith("-join-token")]
