"""The opts contract every GPU-layer component keeps: the caller's provider reaches every child (through
``parent=self``), and ``opts.depends_on`` reaches the first children (Pulumi does not pass a component's
dependencies to its children)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import pulumi
import pulumi_kubernetes as kubernetes

from proxmox_gpu_cluster.recording import Recording
from proxmox_gpu_cluster.testing import run


def check_opts(build: Callable[[pulumi.ResourceOptions], object], component: str, first: Iterable[str]) -> Recording:
    """Run ``build(opts)`` with a provider and a dependency in ``opts``; every custom child of the component named
    ``component`` uses that provider, and each child named in ``first`` waits for the dependency."""

    def program() -> None:
        k8s = kubernetes.Provider("caller-k8s", kubeconfig="{}")
        before = kubernetes.core.v1.Namespace("before", opts=pulumi.ResourceOptions(provider=k8s))
        build(pulumi.ResourceOptions(provider=k8s, depends_on=[before]))

    rec = run(program)
    provider = rec.named("caller-k8s")
    before = rec.named("before")
    children = [r for r in rec.resources if r.custom and r.name.startswith(f"{component}-")]
    assert children, f"no children of {component}"
    for child in children:
        assert child.provider.startswith(provider.urn), f"{child.name} does not use the caller's provider"
    for name in first:
        # Directly: the recording's depends_on() would count the component's own dependency for its children.
        assert before.urn in rec.named(name).dependencies, f"{name} does not wait for opts.depends_on"
    return rec
