"""The fair floor's cluster component and program."""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_command as command
import pulumi_kubernetes as k8s
import pulumi_proxmoxve as proxmoxve

from .common import sharing
from .guest import GuestParts
from .proxmox import ProxmoxParts


class Cluster(ProxmoxParts, GuestParts):
    def __init__(self, name: str, spec: dict[str, Any], secrets: dict[str, pulumi.Output[str]]) -> None:
        super().__init__("proxmox-gpu-cluster:cluster:GpuCluster", name, None)
        self.name, self.spec, self.secrets = name, spec, secrets
        self.key = secrets["sshPrivateKey"]
        px = spec["proxmox"]
        self.proxmox = proxmoxve.Provider(
            f"{name}-proxmox",
            proxmoxve.ProviderArgs(
                endpoint=px["endpoint"],
                insecure=False,
                api_token=secrets["proxmoxApiToken"],
                ssh=proxmoxve.ProviderSshArgs(
                    username="root",
                    private_key=self.key,
                    nodes=[proxmoxve.ProviderSshNodeArgs(name=n["name"], address=n["sshAddress"]) for n in px["nodes"]],
                ),
            ),
            opts=self.moved(f"{name}-proxmox"),
        )
        self.kube = k8s.Provider(
            f"{name}-kubernetes",
            k8s.ProviderArgs(kubeconfig=secrets["kubeconfig"]),
            opts=self.moved(f"{name}-kubernetes"),
        )
        self.cmd = command.Provider(f"{name}-command", opts=self.moved(f"{name}-command"))
        self.api = spec["kubernetes"]["apiEndpoint"]
        workers = spec["workers"]
        vms: dict[str, tuple[proxmoxve.VmLegacy, pulumi.Output[str]]] = {}
        host_agents: dict[str, command.remote.CopyToRemote] = {}
        for node in px["nodes"]:
            devices = proxmoxve.hardware.get_pci(
                node_name=node["name"],
                pci_class_blacklists=[],
                opts=pulumi.InvokeOptions(provider=self.proxmox, parent=self),
            ).devices
            prep, agent = self.host_prep(node)
            host_agents[node["name"]] = agent
            mappings = self.pci(node, devices, prep)
            snippet, image = self.boot_files(node)
            for w in (w for w in workers if w["node"] == node["name"]):
                gpu = next(g for g in node["gpus"] if g["name"] == w["gpus"][0])
                mapping = mappings[gpu["name"]]
                after = [mapping, *([prep] if prep else []), agent]
                vms[w["name"]] = self.vm(node, w, gpu["model"], mapping, snippet, image, after, agent)
        access = self.node_access()
        boots = {w["name"]: self.bootstrap(w, *vms[w["name"]], access, host_agents[w["node"]]) for w in workers}
        migs = {w["name"]: self.mig(w, vms[w["name"]][1], boots[w["name"]]) for w in workers if sharing(w)[1]}
        labels = self.part("gpu_node:GpuNodeLabels", "gpu-nodes")
        patches = {}
        for w in workers:
            config, mig = sharing(w)
            model = self.model(w)
            patches[w["name"]] = k8s.core.v1.NodePatch(
                f"{labels.prefix}-{w['name']}",
                k8s.core.v1.NodePatchArgs(
                    metadata=k8s.meta.v1.ObjectMetaPatchArgs(
                        name=w["name"],
                        annotations={"pulumi.com/patchForce": "true"},
                        labels={
                            "nvidia.com/device-plugin.config": config,
                            "nvidia.com/gpu.workload.config": "container",
                            "proxmox-gpu-cluster.io/accelerator": model,
                            **({"nvidia.com/mig.config": mig} if mig else {}),
                        },
                    ),
                ),
                opts=pulumi.ResourceOptions(
                    parent=labels,
                    provider=self.kube,
                    depends_on=[boots[w["name"]][0], *migs[w["name"]][0]]
                    if w["name"] in migs
                    else [boots[w["name"]][0]],
                    replace_with=[boots[w["name"]][1]],
                ),
            )
        labels.register_outputs({"nodes": [w["name"] for w in workers]})
        for w in workers:
            self.retirement(w, vms[w["name"]][0], [boots[w["name"]][0], patches[w["name"]], host_agents[w["node"]]])
        release = self.operator(workers, list(patches.values()), labels)
        for w in (w for w in workers if w["name"] in migs):  # restart (if due) and wait, once label and release are in
            migs[w["name"]][1](patches[w["name"]], host_agents[w["node"]], release)
        gates = self.part("capacity_gate:NodeCapacityGates", "capacity-gates", depends_on=[release])
        for w in workers:
            self.gate(gates, w, vms[w["name"]][1], boots[w["name"]], patches[w["name"]])
        gates.register_outputs({})
        self.workers = pulumi.Output.from_input(
            {n: {"vmId": vm.vm_id, "ipAddress": ip, "nodeName": n} for n, (vm, ip) in vms.items()}
        )
        self.driver_versions = pulumi.Output.all(
            **{n: b[1].stdout.apply(lambda s: (s or "").strip()) for n, b in boots.items()}
        )
        self.register_outputs({"workers": self.workers, "driverVersions": self.driver_versions})


def program() -> None:
    """The floor program: the cluster from config, secrets as secret Outputs, the project's stack outputs."""
    cfg = pulumi.Config("proxmox-gpu-cluster")
    spec = cfg.require_object("cluster")
    cluster = Cluster("cluster", spec, {k: cfg.require_secret(k) for k in SECRET_KEYS})
    pulumi.export("workers", cluster.workers)
    pulumi.export("driverVersions", cluster.driver_versions)
    pulumi.export("iommuChecks", {n["name"]: "plan" for n in spec["proxmox"]["nodes"]})
    pulumi.export("hostReboots", {n["name"]: "when-idle" for n in spec["proxmox"]["nodes"]})
    pulumi.export("rollingChanges", {"maxUnavailable": 1, "nodes": len(spec["workers"])})
    pulumi.export("capacity", {w["name"]: {"proxmoxNode": w["node"]} for w in spec["workers"]})


# No join token: each join mints its own (a local command with the kubeconfig on stdin), as the program does.
SECRET_KEYS = ("sshPrivateKey", "kubeconfig", "proxmoxApiToken", "kubeadmCaCertHash")


def floor_config(spec: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The stack's config for the floor: the spec and a placeholder per secret key (as the offline plan sets)."""
    keys = [f"proxmox-gpu-cluster:{k}" for k in SECRET_KEYS]
    return {"proxmox-gpu-cluster:cluster": spec, **{k: f"plan-placeholder-{k}" for k in keys}}, keys


def run_floor(spec: dict[str, Any], stack: str = "bench") -> Any:
    """Run the floor under the project's recording mocks (``get_pci`` answers like the spec's hosts)."""
    from proxmox_gpu_cluster.core.spec import load_spec  # noqa: PLC0415 (the mocks only: not the program)
    from proxmox_gpu_cluster.testing import RecordingMocks, run  # noqa: PLC0415
    from proxmox_gpu_cluster.testing_pci import pci_invokes  # noqa: PLC0415

    config, secret_keys = floor_config(spec)
    mocks = RecordingMocks(invokes=pci_invokes(load_spec(spec)))
    return run(program, project="proxmox-gpu-cluster", stack=stack, config=config, secret_keys=secret_keys, mocks=mocks)
