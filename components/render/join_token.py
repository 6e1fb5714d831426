"""A join's own bootstrap token: the step that makes it, how its output is read, and the Secret that makes the API
server accept it. Pure (no Pulumi).

Why a step makes the token and its expiry, and the Kubernetes provider only stores it: a bootstrap token carries its
expiry, and a resource's inputs are fixed by the program, so a Secret whose expiry the program computed would get a
new expiry at every run (an update every time) or, with ``ignoreChanges``, keep the first one even when replaced (the
engine puts ignored inputs back before a replacement too: pulumi v3.276.0 pkg/resource/deploy/step_generator.go,
``processIgnoreChanges``). A local command runs once, when first made, right before its worker's join, and its
output is then fixed in the state; the Secret takes its values from that output, so a later run changes nothing. The
credential stays with the Kubernetes provider: neither the step nor the state of each worker carries it.

The Secret is what ``kubeadm token create`` writes (Kubernetes "Authenticating with Bootstrap Tokens"; kubeadm
cmd/kubeadm/app/phases/bootstraptoken/node/token.go): ``kube-system/bootstrap-token-<id>`` of type
``bootstrap.kubernetes.io/token``, usable for authentication and for signing ``kube-public/cluster-info`` (kubeadm's
token discovery checks that signature), in kubeadm's default node group, which ``kubeadm init`` binds to what a join
needs (creating and auto-approving the kubelet's CSR, reading cluster-info, kubeadm-config and Nodes). The API server
refuses the token after ``expiration`` and the controller manager's token cleaner deletes the Secret. Removing the
worker (or replacing its VM) deletes the Secret too; one the cleaner already deleted counts as deleted
(pulumi-kubernetes v4.32.0 provider/pkg/await/await.go, ``Deletion``: NotFound is success).
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass

JOIN_TOKEN_TTL_SECONDS = 3600
"""How long a join's token is valid. It is made right before the join (after the runtime step), so the join starts
minutes later; an hour also covers an ``up`` run again soon after a join failed."""
NODE_GROUP = "system:bootstrappers:kubeadm:default-node-token"
SECRET_TYPE = "bootstrap.kubernetes.io/token"  # noqa: S105 (a Secret type, not a password)
NAMESPACE = "kube-system"
_OUTPUT = re.compile(r"^token=([a-z0-9]{6})\.([a-z0-9]{16})\nexpiration=(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)$")


@dataclass(frozen=True)
class MintedToken:
    """What the join-token step printed."""

    token_id: str
    token_secret: str
    expiration: str

    @property
    def token(self) -> str:
        """``<id>.<secret>``, what ``kubeadm join`` takes."""
        return f"{self.token_id}.{self.token_secret}"

    @property
    def secret_name(self) -> str:
        return f"bootstrap-token-{self.token_id}"

    def data(self, node: str) -> dict[str, str]:
        """The Secret's ``data`` (base64 values), ``node`` named in its description. ``data``, not ``stringData``,
        which server-side apply does not track well (kubernetes/website#42603; pulumi-kubernetes#2507)."""
        return {key: base64.b64encode(value.encode()).decode() for key, value in self.fields(node).items()}

    def fields(self, node: str) -> dict[str, str]:
        """The Secret's keys and their values, as ``kubeadm token create`` writes them."""
        return {
            "description": f"proxmox-gpu-cluster: the join of node {node}",
            "token-id": self.token_id,
            "token-secret": self.token_secret,
            "expiration": self.expiration,
            "usage-bootstrap-authentication": "true",
            "usage-bootstrap-signing": "true",
            "auth-extra-groups": NODE_GROUP,
        }


def mint_command(ttl: int = JOIN_TOKEN_TTL_SECONDS) -> str:
    """The step's command line (its script, ``join_token.py``, on stdin)."""
    return f"python3 - {int(ttl)}"


def minted(stdout: str | None) -> MintedToken | None:
    """The token in the step's output; None when it has not run (a preview) or printed something else."""
    found = _OUTPUT.match((stdout or "").strip())
    return MintedToken(*found.groups()) if found else None
