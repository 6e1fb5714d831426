"""GpuSmokeTest: a Job that runs nvidia-smi on one GPU resource and must complete."""

from __future__ import annotations

from typing import Annotated

import pulumi
import pulumi_kubernetes as kubernetes
from pydantic import Field, model_validator

from proxmox_gpu_cluster.args import ComponentArgs, Input
from proxmox_gpu_cluster.core.capacity import WorkerCapacity, container_resources
from proxmox_gpu_cluster.core.errors import Problem, SpecViolations
from proxmox_gpu_cluster.core.operator_spec import SmokeTestSpec
from proxmox_gpu_cluster.core.quoting import LINE_BREAKERS
from proxmox_gpu_cluster.core.spec_base import EXTENDED_RESOURCE, Name
from proxmox_gpu_cluster.engine_version import require_cli
from proxmox_gpu_cluster.node_agent import caller_dependencies

RERUN_ANNOTATION = "proxmox-gpu-cluster.io/depends-on"
"""Pod-template annotation carrying the rerun key (a Job's template is immutable: a change replaces the Job)."""
SMOKE_TEST_LABEL = {"app.kubernetes.io/name": "gpu-smoke-test", "app.kubernetes.io/part-of": "proxmox-gpu-cluster"}


class GpuSmokeTestArgs(ComponentArgs):
    """What the test requests and where it runs."""

    test: SmokeTestSpec = Field(default_factory=SmokeTestSpec, description="Image and timeout of the test.")
    resource: Annotated[str, Field(pattern=EXTENDED_RESOURCE, max_length=253)] = Field(
        default="nvidia.com/gpu",
        description="The extended resource the Job requests one unit of (the cluster picks it with "
        "``smoke_test_resource``).",
    )
    namespace: Input[Name] = Field(description="Namespace of the Job (e.g. the operator's ``namespace`` output).")
    rerun_key: Annotated[str, Field(pattern=f"^[^{LINE_BREAKERS}]*$", max_length=256)] = Field(
        default="",
        description="A digest of what the test depends on (driver build, sharing configuration); a new key is a "
        "new pod template, which replaces the Job, so the test runs again.",
    )
    capacity: tuple[WorkerCapacity, ...] = Field(
        default=(),
        description="What the GPU nodes advertise (``GpuStack.capacity()``): when given, ``resource`` must be one a "
        "container node advertises (a Job requesting anything else is never scheduled and times out).",
    )

    @model_validator(mode="after")
    def _schedulable(self) -> GpuSmokeTestArgs:
        advertised = container_resources(self.capacity)
        if self.capacity and self.resource not in advertised:
            known = ", ".join(sorted(advertised)) or "nothing"
            raise SpecViolations([Problem("resource", f"no container node advertises {self.resource} ({known})")])
        return self


class GpuSmokeTest(pulumi.ComponentResource):
    """Runs ``nvidia-smi`` in a pod that requests one unit of a GPU resource the cluster advertises.

    pulumi-kubernetes waits for a Job to report Complete and fails the update on Failed, so ``pulumi up``
    only succeeds once a GPU was scheduled, the runtime injected the driver and nvidia-smi saw the device.
    """

    resource: pulumi.Output[str]
    """The extended resource the Job requested."""
    job: pulumi.Output[str]
    """Name of the Job."""

    def __init__(self, name: str, args: GpuSmokeTestArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        """``opts``: the Kubernetes provider in ``opts.provider`` (the Job inherits it); ``opts.depends_on``: the
        operator release and capacity gates (the Job needs the device plugin and the RuntimeClass)."""
        require_cli()  # before anything registers
        super().__init__("proxmox-gpu-cluster:smoke_test:GpuSmokeTest", name, None, opts)
        test, resource, rerun_key = args.test, args.resource, args.rerun_key
        pod = kubernetes.core.v1.PodSpecArgs(
            restart_policy="Never",
            # The operator creates the nvidia RuntimeClass in both driver modes; with the host toolkit,
            # `nvidia-ctk runtime configure` registers its handler in containerd.
            runtime_class_name="nvidia",
            automount_service_account_token=False,
            # Tainted GPU nodes (nvidia.com/gpu=true:NoSchedule) must still run the test.
            tolerations=[
                kubernetes.core.v1.TolerationArgs(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")
            ],
            containers=[
                kubernetes.core.v1.ContainerArgs(
                    name="nvidia-smi",
                    image=test.image,
                    command=["nvidia-smi"],
                    # Extended resources go in limits; the request defaults to the limit.
                    resources=kubernetes.core.v1.ResourceRequirementsArgs(limits={resource: "1"}),
                    security_context=kubernetes.core.v1.SecurityContextArgs(allow_privilege_escalation=False),
                )
            ],
        )
        job = kubernetes.batch.v1.Job(
            f"{name}-job",
            kubernetes.batch.v1.JobInitArgs(
                metadata=kubernetes.meta.v1.ObjectMetaArgs(
                    namespace=args.namespace,
                    labels=SMOKE_TEST_LABEL,
                    # A Job that failed on an earlier `up` is replaced (re-run) instead of awaited again.
                    annotations={"pulumi.com/replaceUnready": "true"},
                ),
                spec=kubernetes.batch.v1.JobSpecArgs(
                    backoff_limit=1,
                    active_deadline_seconds=test.timeout_seconds,
                    template=kubernetes.core.v1.PodTemplateSpecArgs(
                        metadata=kubernetes.meta.v1.ObjectMetaArgs(
                            labels=SMOKE_TEST_LABEL,
                            annotations={RERUN_ANNOTATION: rerun_key} if rerun_key else None,
                        ),
                        spec=pod,
                    ),
                ),
            ),
            opts=pulumi.ResourceOptions(
                parent=self,
                depends_on=caller_dependencies(opts),
                custom_timeouts=pulumi.CustomTimeouts(create=f"{test.timeout_seconds + 60}s"),
            ),
        )
        self.resource = pulumi.Output.from_input(resource)
        self.job = job.metadata.apply(lambda m: (m.name if m is not None else None) or "")
        self.register_outputs({"resource": self.resource, "job": self.job})
