"""The guest and Kubernetes side of the fair floor: bootstraps, MIG rollouts, retirements, operator, gates."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pulumi
import pulumi_command as command
import pulumi_kubernetes as k8s
import pulumi_proxmoxve as proxmoxve

from .common import (
    AGENT,
    AGENT_DIR,
    DCGM_METRICS,
    ROLLOUT,
    Base,
    Part,
    expect,
    join_token,
    sharing,
    short,
    ssh,
    stdin_of,
    step,
    wait_args,
)


class GuestParts(Base):
    def bootstrap(
        self, w: dict[str, Any], vm: proxmoxve.VmLegacy, host: pulumi.Output[str], access: Part, host_agent: Any
    ) -> tuple[Part, Any, Any]:
        part = self.part("guest_bootstrap:GuestBootstrap", f"{w['name']}-bootstrap", depends_on=[access])
        conn = ssh(host, "ubuntu", self.key)
        replace = [vm]
        agent = command.remote.CopyToRemote(
            f"{part.prefix}-agent",
            command.remote.CopyToRemoteArgs(
                connection=conn, source=pulumi.FileArchive(AGENT_DIR), remote_path=AGENT[:-6]
            ),
            # The first step waits for what its component waits for (Pulumi orders a component's children only
            # after the component's own registration, not after its dependencies).
            opts=pulumi.ResourceOptions(parent=part, provider=self.cmd, replace_with=replace, depends_on=[access]),
        )
        rollout = ROLLOUT.format(node=w["name"], api=self.api)

        def run(role: str, args: str, after: pulumi.Resource, stdin: Any = None, secret: bool = False) -> Any:
            return command.remote.Command(
                f"{part.prefix}-{role}",
                command.remote.CommandArgs(
                    connection=conn,
                    create=step("ubuntu", role, args),
                    stdin=stdin,
                    logging=command.remote.Logging.NONE if secret else None,
                ),
                opts=pulumi.ResourceOptions(
                    parent=part,
                    provider=self.cmd,
                    depends_on=[after],
                    replace_with=replace,
                    additional_secret_outputs=["stdin", "stdout", "stderr"] if secret else None,
                ),
            )

        node = next(n for n in self.spec["proxmox"]["nodes"] if n["name"] == w["node"])
        hold = f"/home/ubuntu/{AGENT}/hold-{short('hold', 12)}/step.sh"
        restart_args = f"--vmid {w['vmid']} --node-name {w['name']} --timeout 600 --hardware {'0' * 16}"
        vm_restart = command.remote.Command(
            f"{part.prefix}-vm-restart",
            command.remote.CommandArgs(
                connection=ssh(node["sshAddress"], "root", self.key),
                create=step("root", "vm-restart", f"{restart_args} --guest-step {hold} -- --why restart {rollout}"),
            ),
            opts=pulumi.ResourceOptions(
                parent=part,
                provider=self.cmd,
                depends_on=[agent, host_agent],
                replace_with=replace,
                # The hold (the default slot wait and drain, 21600 + 600 s), two agent waits, the shutdown, slack.
                custom_timeouts=pulumi.CustomTimeouts(create="24300s", update="24300s"),
            ),
        )
        cloud_init = run("cloud-init", "", vm_restart)
        driver = run("driver", f"--mode host --branch 580 --flavor server --modules open {rollout}", cloud_init)
        wait = command.local.Command(
            f"{part.prefix}-driver-wait",
            wait_args(host, driver.stdout),
            opts=pulumi.ResourceOptions(parent=part, provider=self.cmd, depends_on=[driver], replace_with=replace),
        )
        runtime = run("runtime", "--toolkit 1 --toolkit-version 1.18.2-1 --default-runtime 1 --cdi 0", wait)
        token, stored = join_token(part, self.cmd, self.kube, runtime, replace)
        join_stdin = stdin_of(JOIN_TOKEN=token, CA_CERT_HASH=self.secrets["kubeadmCaCertHash"])
        join = run("join", f"--node-name {w['name']} --api-endpoint {self.api} --minor 34", stored, join_stdin, True)
        verify = run(
            "verify", f"--gpu 10de:2236=NVIDIA --nvidia-smi 1 --driver 580 --containerd-nvidia 1 {rollout}", join
        )
        part.register_outputs(
            {
                "nodeName": w["name"],
                "rebooted": driver.stdout.apply(lambda o: "reboot" in (o or "")),
                "verification": verify.stdout,
                "driverVersion": verify.stdout.apply(lambda o: o or ""),
            }
        )
        return part, verify, agent

    def node_access(self) -> Part:
        """The slot namespace and the RBAC letting nodes (group system:nodes) act for themselves."""
        part = self.part("node_access:NodeStepAccess", "node-access")
        opts = pulumi.ResourceOptions(parent=part, provider=self.kube)
        rbac, name, group = k8s.rbac.v1, "proxmox-gpu-cluster-node-steps", "rbac.authorization.k8s.io"
        cluster_name, managed = f"{name}:proxmox-gpu-cluster", {"app.kubernetes.io/managed-by": "proxmox-gpu-cluster"}
        subjects = [rbac.SubjectArgs(kind="Group", api_group=group, name="system:nodes")]
        ns = k8s.core.v1.Namespace(
            f"{part.prefix}-namespace",
            k8s.core.v1.NamespaceInitArgs(
                metadata=k8s.meta.v1.ObjectMetaArgs(name="proxmox-gpu-cluster", labels=managed)
            ),
            opts=opts,
        )
        namespace = ns.metadata.apply(lambda m: m.name or "")

        def meta(object_name: str, in_namespace: bool) -> k8s.meta.v1.ObjectMetaArgs:
            return k8s.meta.v1.ObjectMetaArgs(
                name=object_name, namespace=namespace if in_namespace else None, labels=managed
            )

        def rules(resource: str, verbs: list[str]) -> list[Any]:
            return [rbac.PolicyRuleArgs(api_groups=[""], resources=[resource], verbs=verbs)]

        rbac.Role(
            f"{part.prefix}-role",
            rbac.RoleInitArgs(metadata=meta(name, True), rules=rules("configmaps", ["list", "create", "update"])),
            opts=opts,
        )
        rbac.RoleBinding(
            f"{part.prefix}-role-binding",
            rbac.RoleBindingInitArgs(
                metadata=meta(name, True),
                role_ref=rbac.RoleRefArgs(api_group=group, kind="Role", name=name),
                subjects=subjects,
            ),
            opts=opts,
        )
        rbac.ClusterRole(
            f"{part.prefix}-cluster-role",
            rbac.ClusterRoleInitArgs(metadata=meta(cluster_name, False), rules=rules("nodes", ["get", "delete"])),
            opts=opts,
        )
        rbac.ClusterRoleBinding(
            f"{part.prefix}-cluster-role-binding",
            rbac.ClusterRoleBindingInitArgs(
                metadata=meta(cluster_name, False),
                role_ref=rbac.RoleRefArgs(api_group=group, kind="ClusterRole", name=cluster_name),
                subjects=subjects,
            ),
            opts=opts,
        )
        part.register_outputs({"namespace": namespace})
        return part

    def mig(
        self, w: dict[str, Any], host: pulumi.Output[str], boot: tuple[Part, Any, Any]
    ) -> tuple[list[pulumi.Resource], Callable[[pulumi.Resource, pulumi.Resource, pulumi.Resource], None]]:
        """The drain (its begin step), and what makes the settle (the restart on the VM's Proxmox node, and the end
        step) once the label patch exists (the patch and the node's agent copy)."""
        name = f"{self.name}-{w['name']}-mig"
        former = "proxmox-gpu-cluster:mig_rollout:MigRollout"
        drain = Part(
            "mig_rollout:MigDrain",
            name,
            pulumi.ResourceOptions.merge(
                self.moved(name, depends_on=[boot[0]]), pulumi.ResourceOptions(aliases=[pulumi.Alias(type_=former)])
            ),
        )
        conn = ssh(host, "ubuntu", self.key)
        rollout = ROLLOUT.format(node=w["name"], api=self.api)
        mig_args = f"--mig-config {sharing(w)[1]} --timeout 600 --operator-namespace gpu-operator --mig-mode 0=1"

        def phase(name: str, parent: Part, opts: pulumi.ResourceOptions, limit: int) -> command.remote.Command:
            args = f"--phase {name} {mig_args} {rollout}"
            return command.remote.Command(
                f"{drain.prefix}-{name}",
                command.remote.CommandArgs(connection=conn, create=step("ubuntu", "mig", args)),
                opts=pulumi.ResourceOptions.merge(
                    pulumi.ResourceOptions(
                        parent=parent,
                        provider=self.cmd,
                        replace_with=[boot[1]],
                        custom_timeouts=pulumi.CustomTimeouts(create=f"{limit}s", update=f"{limit}s"),
                    ),
                    opts,
                ),
            )

        begin = phase("begin", drain, pulumi.ResourceOptions(depends_on=[boot[0]]), 22500)
        drain.register_outputs({})

        def settle(patch: pulumi.Resource, agent: pulumi.Resource, release: pulumi.Resource) -> None:
            after = [drain, patch, agent, release]
            part = self.part("mig_rollout:MigSettle", f"{w['name']}-mig-settle", depends_on=after)
            old_parent = part.urn.apply(
                lambda u: u.rpartition("::")[0].replace(":MigSettle", f"${former}"[1:]) + f"::{name}"
            )
            was = [pulumi.Alias(parent=old_parent)]
            node = next(n for n in self.spec["proxmox"]["nodes"] if n["name"] == w["node"])
            guest = f"/home/ubuntu/{AGENT}/mig-{short('mig', 12)}/step.sh"
            args = f"--vmid {w['vmid']} --node-name {w['name']} --timeout 600 --guest-step {guest} -- --phase restart"
            restart = command.remote.Command(
                f"{drain.prefix}-restart",
                command.remote.CommandArgs(
                    connection=ssh(node["sshAddress"], "root", self.key),
                    create=step("root", "mig-restart", f"{args} {mig_args} {rollout}"),
                ),
                opts=pulumi.ResourceOptions(
                    parent=part,
                    provider=self.cmd,
                    depends_on=after,
                    replace_with=[boot[1]],
                    # Two agent waits, two guest runs, the shutdown and slack (3120 s), and the hold before a
                    # restart: the default slot wait and drain (21600 + 600 s).
                    custom_timeouts=pulumi.CustomTimeouts(create="25320s", update="25320s"),
                    aliases=was,
                ),
            )
            end = phase("end", part, pulumi.ResourceOptions(depends_on=[restart], aliases=was), 900)
            part.register_outputs({"settled": end.stdout})

        return [begin], settle

    def retirement(self, w: dict[str, Any], vm: proxmoxve.VmLegacy, after: list[pulumi.Resource]) -> None:
        part = self.part("worker_retirement:WorkerRetirement", f"{w['name']}-retirement", depends_on=after)
        node = next(n for n in self.spec["proxmox"]["nodes"] if n["name"] == w["node"])
        guest = f"--node-name {w['name']} --api-endpoint {self.api} --timeout 600 --delete-emptydir-data 1 --force 0"
        drain = f"/home/ubuntu/{AGENT}/drain-{short('drain', 12)}/step.sh"
        retire = f"--vmid {w['vmid']} --node-name {w['name']} --timeout 600 --guest-step {drain}"

        def args(check: int) -> str:
            return step("root", "retire", f"{retire} --check {check} -- {guest} --kubeadm-reset 1")

        drain_step = command.remote.Command(
            f"{part.prefix}-drain",
            command.remote.CommandArgs(
                connection=ssh(node["sshAddress"], "root", self.key),
                create=args(1),
                delete=args(0),
                add_previous_output_in_env=False,
            ),
            opts=pulumi.ResourceOptions(parent=part, provider=self.cmd, replace_with=[vm], depends_on=after),
        )
        part.register_outputs({"ready": drain_step.stdout})

    def operator(self, workers: list[dict[str, Any]], patches: list[Any], labels: Part) -> k8s.helm.v3.Release:
        part = self.part("gpu_operator:GpuOperator", "gpu-operator")  # the release alone waits (release_after)
        opts = pulumi.ResourceOptions(parent=part, provider=self.kube)
        ns = k8s.core.v1.Namespace(
            f"{part.prefix}-namespace",
            k8s.core.v1.NamespaceInitArgs(
                metadata=k8s.meta.v1.ObjectMetaArgs(
                    name="gpu-operator", labels={"pod-security.kubernetes.io/enforce": "privileged"}
                )
            ),
            opts=opts,
        )

        def config_map(role: str, data: dict[str, str]) -> k8s.core.v1.ConfigMap:
            return k8s.core.v1.ConfigMap(
                f"{part.prefix}-{role}",
                k8s.core.v1.ConfigMapInitArgs(
                    metadata=k8s.meta.v1.ObjectMetaArgs(
                        name=f"{role}-{short(json.dumps(data, sort_keys=True), 10)}", namespace=ns.metadata.name
                    ),
                    data=data,
                ),
                opts=opts,
            )

        flags = "version: v1\nflags:\n  migStrategy: mixed\n"
        plugin = {"default": flags}
        mig_configs: dict[str, str] = {}
        for w in workers:
            config, mig = sharing(w)
            if config != "default":
                replicas = w["timeSlicing"]["replicas"]
                plugin[config] = (
                    f"{flags}sharing:\n  timeSlicing:\n    renameByDefault: false\n    failRequestsGreaterThanOne: "
                    f"false\n    resources:\n    - name: nvidia.com/gpu\n      replicas: {replicas}\n"
                )
            if mig and mig.startswith("custom-"):
                mig_configs[mig] = "\n".join(
                    f"  - devices: all\n    mig-enabled: true\n    mig-devices: {{{p}: {n}}}"
                    for p, n in sorted(w["mig"].items())
                )
        dp = config_map("device-plugin-config", plugin)
        mig_name: pulumi.Input[str] = ""
        if mig_configs:
            mig_map = config_map(
                "mig-config",
                {
                    "config.yaml": "version: v1\nmig-configs:\n"
                    + "".join(f"  {k}:\n{v}\n" for k, v in sorted(mig_configs.items()))
                },
            )
            mig_name = mig_map.metadata.name
        dcgm = config_map("dcgm-metrics", {"dcgm-metrics.csv": DCGM_METRICS})
        names = pulumi.Output.all(dp.metadata.name, mig_name, dcgm.metadata.name)
        release = k8s.helm.v3.Release(
            f"{part.prefix}-release",
            k8s.helm.v3.ReleaseArgs(
                chart="gpu-operator",
                name="gpu-operator",
                version="v26.7.0",
                namespace=ns.metadata.name,
                atomic=True,
                cleanup_on_fail=True,
                max_history=10,
                timeout=900,
                repository_opts=k8s.helm.v3.RepositoryOptsArgs(repo="https://helm.ngc.nvidia.com/nvidia"),
                values=names.apply(
                    lambda n: {
                        "cdi": {"enabled": False},
                        "driver": {"enabled": False},
                        "toolkit": {"enabled": False},
                        "devicePlugin": {"config": {"create": False, "default": "default", "name": n[0]}},
                        "migManager": {"enabled": True, "config": {"create": False, "name": n[1]}},
                        "mig": {"strategy": "mixed"},
                        "dcgmExporter": {
                            "enabled": True,
                            "config": {"name": n[2]},
                            "serviceMonitor": {"enabled": False},
                        },
                        "nfd": {"enabled": True},
                    }
                ),
            ),
            opts=pulumi.ResourceOptions(parent=part, provider=self.kube, depends_on=[labels]),
        )
        part.register_outputs(
            {
                "namespace": ns.metadata.name,
                "devicePluginConfig": dp.metadata.name,
                "releaseStatus": release.status.apply(lambda s: s.status or ""),
            }
        )
        return release

    def gate(
        self, gates: Part, w: dict[str, Any], host: pulumi.Output[str], boot: tuple[Part, Any, Any], patch: Any
    ) -> None:
        part = Part(
            "capacity_gate:NodeCapacityGate",
            f"{self.name}-{w['name']}-capacity",
            pulumi.ResourceOptions(parent=gates, aliases=[pulumi.Alias(parent=self)]),
        )
        model = self.model(w)
        args = " ".join(
            [
                f"--node {w['name']} --timeout 600",
                *(f"--expect {e}" for e in expect(w, model)),
                f"--device-plugin-config {sharing(w)[0]}",
            ]
        )
        check = command.remote.Command(
            f"{part.prefix}-check",
            command.remote.CommandArgs(
                connection=ssh(host, "ubuntu", self.key), create=step("ubuntu", "capacity", args)
            ),
            opts=pulumi.ResourceOptions(
                parent=part,
                provider=self.cmd,
                depends_on=[patch, boot[2]],
                replace_with=[boot[1]],
                custom_timeouts=pulumi.CustomTimeouts(create="900s", update="900s"),
            ),
        )
        part.register_outputs({"verified": check.stdout})
