"""GuestBootstrap: turn an SSH-reachable Ubuntu 22.04/24.04 GPU host into a verified Kubernetes GPU node."""

from __future__ import annotations

from collections.abc import Sequence

import pulumi
import pulumi_command as command
import pulumi_kubernetes as kubernetes
from pydantic import Field, model_validator

from proxmox_gpu_cluster.args import ComponentArgs, Input
from proxmox_gpu_cluster.core.errors import Problem, SpecViolations
from proxmox_gpu_cluster.core.guest_spec import GuestBootstrapSpec
from proxmox_gpu_cluster.core.spec_base import HostName
from proxmox_gpu_cluster.engine_version import require_cli
from proxmox_gpu_cluster.node_agent import caller_dependencies, install_agent
from proxmox_gpu_cluster.render.agent_bundle import installed_step, secrets_stdin, step_command
from proxmox_gpu_cluster.render.guest_scripts import (
    CA_CERT_HASH_VAR,
    JOIN_TOKEN_VAR,
    after_key,
    driver_args,
    hold_args,
    join_args,
    runtime_args,
    verify_args,
)
from proxmox_gpu_cluster.render.host_scripts import REBOOT_SCHEDULED, script, vm_restart_args
from proxmox_gpu_cluster.render.join_token import NAMESPACE, SECRET_TYPE, mint_command, minted
from proxmox_gpu_cluster.ssh import connection as ssh_connection
from proxmox_gpu_cluster.ssh import reboot_wait_args


def driver_version_of(verification: str | None) -> str:
    """The driver build from the verify step's output (``verify: driver: 580.95.05``), or ""."""
    for line in (verification or "").splitlines():
        if line.startswith("verify: driver: "):
            return line.removeprefix("verify: driver: ").strip()
    return ""


AGENT_WAIT_SECONDS = 600
"""How long the VM-restart step waits for the VM's QEMU guest agent after a start."""


class VmRestartArgs(ComponentArgs):
    """The worker's VM on its Proxmox node, for the step that applies its pending hardware (vm_restart.sh)."""

    vmid: Input[int] = Field(description="The VM's Proxmox id.")
    host: Input[HostName] = Field(description="The SSH address of the Proxmox node the VM runs on.")
    ssh_user: str = Field(description="The Proxmox node's SSH user (root, or passwordless sudo).")
    hardware: str = Field(
        pattern=r"^[0-9a-f]{16}$", description="``core.guest_spec.hardware_key`` of the worker: a change reruns it."
    )
    after: Sequence[pulumi.Resource] = Field(
        default=(), description="What it waits for besides the guest's agent copy (the Proxmox node's agent copy)."
    )


class GuestBootstrapArgs(ComponentArgs):
    """What makes a reachable Ubuntu machine a GPU node, and how to reach it."""

    bootstrap: GuestBootstrapSpec = Field(description="The node: its name, GPUs, driver, runtime and join settings.")
    host: Input[HostName] = Field(
        description="The address the steps connect to; pass an output of the machine (``GpuWorkerVm.ip_address``) "
        "so the steps wait for it."
    )
    user: str = Field(description="SSH user on the machine (root, or passwordless sudo).")
    ssh_private_key: Input[str] | None = Field(
        description="SSH private key (a secret); None means the ssh-agent (``proxmox.sshAgent``): no step "
        "carries a key."
    )
    join_token: Input[str] | None = Field(
        default=None,
        description="kubeadm bootstrap token (join method kubeadm); kept secret whatever is passed. None: each join "
        "gets its own, made right before it and valid for an hour, stored as a Secret through the Kubernetes "
        "provider in ``opts.providers`` (``render/join_token.py``).",
    )
    ca_cert_hash: Input[str] | None = Field(
        default=None, description="kubeadm discovery CA cert hash (join method kubeadm); kept secret."
    )
    port: int = Field(default=22, ge=1, le=65535, description="SSH port.")
    replace_with: Sequence[pulumi.Resource] = Field(
        default=(),
        description="Resources whose replacement means a fresh machine (the VM): every step runs again. A per-child "
        "option that ``opts`` cannot carry.",
    )
    vm_restart: VmRestartArgs | None = Field(
        default=None,
        description="For a Proxmox VM: after the agent copy, a step on its Proxmox node that applies pending hardware "
        "(the node held in its rollout slot, the VM stopped and started); the verify step then checks it.",
    )

    @model_validator(mode="after")
    def _join_secrets(self) -> GuestBootstrapArgs:
        if self.bootstrap.join_method == "kubeadm" and self.ca_cert_hash is None:
            raise SpecViolations([Problem("ca_cert_hash", "join method kubeadm (bootstrap.join_method) needs it")])
        return self


class GuestBootstrap(pulumi.ComponentResource):
    """One chain of steps over SSH, each waiting for the previous one, after ``agent``: the node agent copied to the
    guest once (``~/.proxmox-gpu-cluster/agent``, see ``render/agent_bundle.py``); each step runs its bundle by
    fingerprint, with only its secrets on stdin, and re-runs exactly when its arguments or its bundle change.

    1. ``cloud-init``: Ubuntu 22.04/24.04, and ``cloud-init status --wait``.
    2. ``driver``: nouveau blacklisted; in host mode the NVIDIA driver from Ubuntu's archive, pinned and held.
       ``driver-wait`` (where ``pulumi up`` runs) waits for the guest to reboot if, and only if, the driver
       step scheduled a reboot.
    3. ``runtime``: containerd (systemd cgroups) and, with the host driver, the NVIDIA Container Toolkit.
    4. ``join``: ``kubeadm join`` (join method kubeadm only); the token and CA hash travel on stdin. Without
       ``join_token``: first ``join-token`` (where ``pulumi up`` runs) makes a token valid for an hour and
       ``join-token-secret`` stores it as a Secret through the Kubernetes provider.
    5. ``verify``: exactly the expected GPUs on the PCI bus and in ``nvidia-smi``, the nvidia runtime in
       containerd. Whatever needs the node (labels, the operator) should depend on this component.

    Pins (driver branch and version, toolkit version, Kubernetes minor) are in each step's command line, so
    changing one updates that step in place (its command runs again) rather than replacing anything; the
    scripts are idempotent, so a re-run with nothing to do changes nothing. The driver step's delete command
    purges the driver only when ``purge_driver_on_destroy`` is set.
    """

    host: pulumi.Output[str]
    """The address the steps connect to (for whatever else must run on the host later)."""
    node_name: pulumi.Output[str]
    """The Kubernetes node name the host joined as."""
    rebooted: pulumi.Output[bool]
    """Whether the driver step rebooted the host on its last run."""
    driver_version: pulumi.Output[str]
    """The NVIDIA driver build the host runs, as the verify step read it ("" without a host driver)."""
    verification: pulumi.Output[str]
    """The verification step's report (``verify: ok: ...``)."""
    agent: command.remote.CopyToRemote
    """The node agent's copy on the guest; whatever else runs a step there (MIG rollout, capacity gate) waits for it."""
    final_step: command.remote.Command
    """The last step (verify). It is replaced whenever the chain starts over on a fresh machine, so whatever must be
    applied again to a new machine (its node labels) can name it in ``replace_with``."""

    def __init__(self, name: str, args: GuestBootstrapArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        """``opts``: the command provider in ``opts.provider`` or ``opts.providers`` (every step inherits it), and,
        without ``join_token``, the cluster's Kubernetes provider in ``opts.providers`` (else Pulumi's default one
        stores the join's token); ``opts.depends_on`` reaches
        the agent copy, and so every step: with a rollout (``bootstrap.rollout``) the steps act as the node itself,
        with kubelet's credential on the machine, so pass the cluster's ``NodeStepAccess`` (its RBAC) there."""
        require_cli()  # before anything registers
        super().__init__("proxmox-gpu-cluster:guest_bootstrap:GuestBootstrap", name, None, opts)
        bootstrap, host, user, port, replace_with = args.bootstrap, args.host, args.user, args.port, args.replace_with
        kubeadm = bootstrap.join_method == "kubeadm"
        connection = ssh_connection(host, user, args.ssh_private_key, port)

        self.agent = install_agent(
            f"{name}-agent",
            "guest",
            connection=connection,
            parent=self,
            replace_with=replace_with,
            depends_on=caller_dependencies(opts),
        )

        made: dict[str, str] = {}  # role -> its command line, for verify's --after

        def step(
            role: str,
            args: list[str],
            after: pulumi.Resource,
            stdin: pulumi.Input[str] | None,
            *,
            delete: str | None = None,
            secret: bool = False,
        ) -> command.remote.Command:
            made[role] = step_command(user, role, args)
            return command.remote.Command(
                f"{name}-{role}",
                command.remote.CommandArgs(
                    connection=connection,
                    create=made[role],
                    delete=delete,
                    stdin=stdin,
                    # kubeadm prints no secret, but nothing of a secret-fed step is logged or stored in clear.
                    logging=command.remote.Logging.NONE if secret else None,
                ),
                opts=pulumi.ResourceOptions(
                    parent=self,
                    depends_on=[after],
                    replace_with=list(replace_with),
                    additional_secret_outputs=["stdin", "stdout", "stderr"] if secret else None,
                ),
            )

        first: pulumi.Resource = self.agent
        if args.vm_restart is not None:
            first = self._vm_restart(f"{name}-vm-restart", args, args.vm_restart)
        cloud_init = step("cloud-init", [], first, None)
        purge = step_command(user, "driver", [*driver_args(bootstrap), "--purge"])
        driver = step(
            "driver",
            driver_args(bootstrap),
            cloud_init,
            None,
            delete=purge if bootstrap.purge_driver_on_destroy else None,
        )
        wait = command.local.Command(
            f"{name}-driver-wait",
            # An input, not a trigger: a new driver output updates this step (it runs again) in place.
            reboot_wait_args(host, port, driver.stdout),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[driver], replace_with=list(replace_with)),
        )
        last: pulumi.Resource = step("runtime", runtime_args(bootstrap), wait, None)
        if kubeadm:
            token: pulumi.Input[str]
            if args.join_token is None:
                token, last = self._mint(name, bootstrap.node_name, last, replace_with)
            else:
                token = args.join_token
            stdin = pulumi.Output.all(token, args.ca_cert_hash).apply(
                lambda values: secrets_stdin({JOIN_TOKEN_VAR: values[0], CA_CERT_HASH_VAR: values[1]})
            )
            last = step("join", join_args(bootstrap), last, pulumi.Output.secret(stdin), secret=True)
        # Verify uncordons what the driver, join and VM-restart steps cordoned: it runs again whenever they do.
        cordoning = [made[role] for role in ("driver", "join") if role in made]
        cordoning += [args.vm_restart.hardware] if args.vm_restart is not None else []
        verify = step("verify", verify_args(bootstrap, after=after_key(*cordoning)), last, None)
        self.node_name = pulumi.Output.from_input(bootstrap.node_name)
        self.host = pulumi.Output.from_input(host)
        self.rebooted = driver.stdout.apply(lambda out: REBOOT_SCHEDULED in (out or ""))
        self.verification = verify.stdout
        self.driver_version = verify.stdout.apply(driver_version_of)
        self.final_step = verify
        self.register_outputs(
            {
                "nodeName": self.node_name,
                "rebooted": self.rebooted,
                "verification": self.verification,
                "driverVersion": self.driver_version,
            }
        )

    def _mint(
        self, name: str, node: str, after: pulumi.Resource, replace_with: Sequence[pulumi.Resource]
    ) -> tuple[pulumi.Output[str], pulumi.Resource]:
        """The join's own token: the ``join-token`` step makes it right before the join, once (it runs again only
        when replaced: with the VM, or by ``pulumi up --replace``; an update would run ``create`` again and a
        preview keeps the last output, pulumi-command v1.0.1 provider/pkg/provider/local/commandController.go), and
        the ``join-token-secret`` Secret, through the Kubernetes provider, makes the API server accept it. Returns the
        token and the Secret, which the join waits for."""
        mint = command.local.Command(
            f"{name}-join-token",
            command.local.CommandArgs(
                create=mint_command(),
                stdin=script("join_token.py"),
                logging=command.local.Logging.NONE,
                # Else a re-run's environment would carry the last token (PULUMI_COMMAND_STDOUT; commandOutputs.go).
                add_previous_output_in_env=False,
            ),
            opts=pulumi.ResourceOptions(
                parent=self,
                depends_on=[after],
                replace_with=list(replace_with),
                additional_secret_outputs=["stdout", "stderr"],
            ),
        )
        made = mint.stdout.apply(minted)
        # The id is the token's public half (`kubeadm token list` shows it): the Secret's name need not be secret.
        secret_name = pulumi.Output.unsecret(made.apply(lambda m: m.secret_name if m else ""))
        stored = kubernetes.core.v1.Secret(
            f"{name}-join-token-secret",
            kubernetes.core.v1.SecretInitArgs(
                metadata=kubernetes.meta.v1.ObjectMetaArgs(name=secret_name, namespace=NAMESPACE),
                type=SECRET_TYPE,
                data=pulumi.Output.secret(made.apply(lambda m: m.data(node) if m else {})),
            ),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[mint]),
        )
        token: pulumi.Output[str] = made.apply(lambda m: m.token if m else "")
        return token, stored

    def _vm_restart(self, name: str, args: GuestBootstrapArgs, r: VmRestartArgs) -> command.remote.Command:
        b = args.bootstrap

        def create(vmid: int) -> str:
            restart = vm_restart_args(
                vmid, b.node_name, AGENT_WAIT_SECONDS, hardware=r.hardware,
                guest_step=installed_step(args.user, "hold"), guest_args=hold_args(b),
            )  # fmt: skip
            return step_command(r.ssh_user, "vm-restart", restart)

        vmid = r.vmid
        command_line = (
            create(vmid) if isinstance(vmid, int) else pulumi.Output.all(vmid).apply(lambda v: create(int(v[0])))
        )
        # The hold (a slot wait and the drain), two guest-agent waits, the shutdown (qm's 300 s), and slack.
        hold = b.rollout.wait_seconds + b.rollout.drain_timeout_seconds if b.rollout else 0
        limit = hold + 2 * AGENT_WAIT_SECONDS + 300 + 600
        return command.remote.Command(
            name,
            command.remote.CommandArgs(
                connection=ssh_connection(r.host, r.ssh_user, args.ssh_private_key), create=command_line
            ),
            opts=pulumi.ResourceOptions(
                parent=self,
                depends_on=[self.agent, *r.after],
                replace_with=list(args.replace_with),
                custom_timeouts=pulumi.CustomTimeouts(create=f"{limit}s", update=f"{limit}s"),
            ),
        )
