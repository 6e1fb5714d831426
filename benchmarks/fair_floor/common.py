"""Shared by the fair floor's parts: constants, small helpers, the component base."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

import pulumi
import pulumi_command as command
import pulumi_kubernetes as k8s
import pulumi_proxmoxve as proxmoxve

ROOT = Path(__file__).resolve().parents[2]
_WAIT = (ROOT / "components" / "scripts" / "wait_for_reboot.py").read_text()
WAIT_SCRIPT = "\n".join(
    line
    for line in _WAIT[_WAIT.index('"""', 3) + 3 :].splitlines()
    if line.strip() and not line.lstrip().startswith("#")
)
"""The reboot wait a user would ship beside the program (read as a file, not imported), without its comments."""
AGENT_DIR = str(ROOT / "components" / "scripts")
"""The directory of step scripts copied to every machine."""
AGENT = ".proxmox-gpu-cluster/agent"
MODELS: dict[str, dict[str, Any]] = {
    "A10": {"id": "10de:2236", "large_bar": False},
    "L4": {"id": "10de:27b8", "large_bar": False},
    "A100-PCIE-40GB": {"id": "10de:20f1", "large_bar": True, "slices": {"1g.5gb": 7}},
    "A100-PCIE-80GB": {"id": "10de:20b5", "large_bar": True, "slices": {"1g.10gb": 7}},
}
"""What the user knows of their GPUs: PCI ids, whether the BAR needs a large MMIO window, MIG capacity."""
ROLLOUT = "--rollout 1 --rollout-node {node} --rollout-api {api}"


def short(text: str, n: int = 8) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:n]


def step(user: str, role: str, args: str = "") -> str:
    sudo = "" if user == "root" else "sudo -n "
    return f"{sudo}bash {AGENT}/{role}-{short(role, 12)}/step.sh {args}".rstrip()


def stdin_of(**values: pulumi.Input[str]) -> pulumi.Output[str]:
    """Secrets as ``NAME=value`` lines on stdin, secret."""
    return pulumi.Output.secret(
        pulumi.Output.all(**values).apply(lambda v: "".join(f"{k}={json.dumps(x)}\n" for k, x in v.items()))
    )


def ssh(host: pulumi.Input[str], user: str, key: pulumi.Input[str]) -> command.remote.ConnectionArgs:
    return command.remote.ConnectionArgs(
        host=host, port=22, user=user, private_key=key, dial_error_limit=30, per_dial_timeout=10
    )


def wait_args(host: pulumi.Input[str], output: pulumi.Input[str], triggers: list[Any] | None = None) -> Any:
    return command.local.CommandArgs(
        create="python3 -",
        stdin=WAIT_SCRIPT,
        environment={"PGC_HOST": host, "PGC_PORT": "22", "PGC_PREP_OUTPUT": output},
        triggers=triggers,
    )


def sharing(worker: dict[str, Any]) -> tuple[str, str | None]:
    """Device-plugin config name and MIG geometry label of a worker."""
    if worker.get("sharing") == "time-slicing":
        replicas = worker["timeSlicing"]["replicas"]
        return f"time-slicing-{replicas}-{short(str(replicas))}", None
    mig = worker.get("mig")
    if worker.get("sharing") == "mig":
        return "default", mig if isinstance(mig, str) else f"custom-{short(json.dumps(mig, sort_keys=True))}"
    return "default", None


def expect(worker: dict[str, Any], model: str) -> list[str]:
    if worker.get("sharing") == "time-slicing":
        return [f"nvidia.com/gpu={worker['timeSlicing']['replicas']}"]
    mig = worker.get("mig")
    if isinstance(mig, str):
        return [f"nvidia.com/mig-{p}={n}" for p, n in MODELS[model]["slices"].items()]
    if isinstance(mig, dict):
        return [f"nvidia.com/mig-{p}={n}" for p, n in sorted(mig.items())]
    return ["nvidia.com/gpu=1"]


class Part(pulumi.ComponentResource):
    """A named group of resources (one per component type of the graph); children are named ``<prefix>-...``."""

    def __init__(self, kind: str, name: str, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(f"proxmox-gpu-cluster:{kind}", name, None, opts)
        self.prefix = name


class Base(pulumi.ComponentResource):
    """What every part of the floor's cluster reads: its name, spec, secrets and providers."""

    name: str
    spec: dict[str, Any]
    secrets: dict[str, pulumi.Output[str]]
    key: pulumi.Output[str]
    api: str
    proxmox: proxmoxve.Provider
    kube: k8s.Provider
    cmd: command.Provider

    def moved(self, name: str, **more: Any) -> pulumi.ResourceOptions:
        """Options of a direct child: it was created at the stack root before this component existed, as ``name``
        without the ``<cluster>-`` prefix."""
        was = pulumi.Alias(name=name.removeprefix(f"{self.name}-"), parent=pulumi.ROOT_STACK_RESOURCE)
        return pulumi.ResourceOptions(parent=self, aliases=[was], **more)

    def model(self, w: dict[str, Any]) -> str:
        node = next(n for n in self.spec["proxmox"]["nodes"] if n["name"] == w["node"])
        return str(next(g["model"] for g in node["gpus"] if g["name"] == w["gpus"][0]))

    def part(self, kind: str, suffix: str, **more: Any) -> Part:
        name = f"{self.name}-{suffix}"
        return Part(kind, name, self.moved(name, **more))


VENDOR_DATA = """#cloud-config
write_files:
- path: /etc/modprobe.d/blacklist-nouveau.conf
  owner: root:root
  permissions: '0644'
  content: '# Managed by proxmox-gpu-cluster

    blacklist nouveau

    options nouveau modeset=0

    '
package_update: true
packages:
- qemu-guest-agent
runcmd:
- - sh
  - -c
  - if lsmod | grep -q '^nouveau '; then modprobe -r nouveau; fi
- - update-initramfs
  - -u
- - systemctl
  - enable
  - --now
  - qemu-guest-agent
"""
DCGM_METRICS = "# Managed by hand (gpuOperator.monitoring.metrics)\n# DCGM field, type, help\n" + "".join(
    f"DCGM_FI_{f}, gauge, {f.lower().replace('_', ' ')}\n"
    for f in (
        "DEV_GPU_UTIL",
        "DEV_MEM_COPY_UTIL",
        "DEV_FB_USED",
        "DEV_FB_FREE",
        "DEV_GPU_TEMP",
        "DEV_POWER_USAGE",
        "DEV_SM_CLOCK",
        "DEV_MEM_CLOCK",
        "PROF_PIPE_TENSOR_ACTIVE",
        "DEV_XID_ERRORS",
        "DEV_ECC_SBE_VOL_TOTAL",
        "DEV_ECC_DBE_VOL_TOTAL",
        "DEV_ROW_REMAP_FAILURE",
        "DEV_PCIE_REPLAY_COUNTER",
    )
)

MINT_SCRIPT = (
    "import secrets, string, sys, datetime as d\n"
    "pick = lambda n: ''.join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(n))\n"
    "print(f'token={pick(6)}.{pick(16)}')\n"
    "print('expiration=' + (d.datetime.now(d.timezone.utc) + d.timedelta(seconds=int(sys.argv[1]))).isoformat())\n"
)


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def join_token(
    part: Any,
    cmd: pulumi.ProviderResource,
    kube: pulumi.ProviderResource,
    runtime: pulumi.Resource,
    replace: list[pulumi.Resource],
) -> tuple[pulumi.Output[str], pulumi.Resource]:
    """A join's token, made right before it (a short stdlib script on stdin), stored as its Secret through the
    cluster's Kubernetes provider; the token and the Secret, which the join waits for."""
    mint = command.local.Command(
        f"{part.prefix}-join-token",
        command.local.CommandArgs(
            create="python3 - 3600",
            stdin=MINT_SCRIPT,
            logging=command.local.Logging.NONE,
            add_previous_output_in_env=False,
        ),
        opts=pulumi.ResourceOptions(
            parent=part,
            provider=cmd,
            depends_on=[runtime],
            replace_with=replace,
            additional_secret_outputs=["stdout", "stderr"],
        ),
    )
    fields = mint.stdout.apply(lambda o: dict(line.split("=", 1) for line in (o or "").splitlines() if "=" in line))
    token = fields.apply(lambda f: f.get("token", ""))
    token_id = pulumi.Output.unsecret(token.apply(lambda t: t.split(".")[0]))
    stored = k8s.core.v1.Secret(
        f"{part.prefix}-join-token-secret",
        k8s.core.v1.SecretInitArgs(
            metadata=k8s.meta.v1.ObjectMetaArgs(name=token_id.apply(lambda i: f"bootstrap-token-{i}"),
                                                namespace="kube-system"),
            type="bootstrap.kubernetes.io/token",
            data=pulumi.Output.secret(fields.apply(lambda f: {k: b64(v) for k, v in f.items()})),
        ),
        opts=pulumi.ResourceOptions(parent=part, provider=kube, depends_on=[mint]),
    )  # fmt: skip
    return token, stored
