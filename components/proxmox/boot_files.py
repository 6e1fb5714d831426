"""WorkerBootFiles: what a Proxmox node needs to boot its GPU workers: cloud images and the vendor-data snippet."""

from __future__ import annotations

import pulumi
import pulumi_proxmoxve as proxmoxve
from pydantic import Field

from proxmox_gpu_cluster.args import ComponentArgs
from proxmox_gpu_cluster.core.names import StackScope, short_hash
from proxmox_gpu_cluster.core.spec import Image
from proxmox_gpu_cluster.engine_version import require_cli
from proxmox_gpu_cluster.node_agent import caller_dependencies
from proxmox_gpu_cluster.outputs import current_scope
from proxmox_gpu_cluster.render.cloud_init import vendor_data


class WorkerBootFilesArgs(ComponentArgs):
    """What one Proxmox node's boot files are made of."""

    node_name: str = Field(
        description="The Proxmox node the files go to (a plain name: it is part of the files' names)."
    )
    images: tuple[Image, ...] = Field(
        description="The boot images of the node's workers (template clones and repeats are skipped)."
    )
    snippet_datastore: str = Field(default="local", description="A datastore with the snippets content type.")
    scope: StackScope | None = Field(
        default=None, description="The project and stack the file names belong to (default: this program's)."
    )


class WorkerBootFiles(pulumi.ComponentResource):
    """Per node: one download per distinct cloud image its workers use, and the cloud-init vendor-data snippet.

    Both live on shared datastores, so their file names are scoped to the project and stack
    (``components.names``): two stacks on one node never overwrite or delete each other's files, and two URLs
    with the same basename never share one. A file of exactly that name that is already there can only be a
    leftover of this stack (an interrupted run, a state edit): it is replaced by a fresh download
    (``overwrite_unmanaged``) instead of failing with "already exists".

    The snippet is uploaded over SSH by the provider (the API cannot write snippets); the datastore must have the
    ``snippets`` content type enabled. A VM's cloud-init drive references the snippet whenever the VM starts, so
    its name never changes and a new vendor-data text replaces it in place (delete first: same name). VMs ignore
    changes to it (``GpuWorkerVm``): vendor data only matters on a VM's first boot.
    """

    vendor_data_file_id: pulumi.Output[str]
    """Volume id of the vendor-data snippet, as the provider reports it. A VM that takes it as an input becomes a
    dependent of the snippet's delete-first replacement: the engine deletes such dependents first when an input
    from it could force their replacement (pulumi/pulumi v3.259.0 pkg/resource/deploy/step_generator.go
    ``calculateDependentReplacements`` makes the whole ``initialization`` unknown), so wire VMs with
    ``vendor_data_volume`` and ``vendor_data_snippet`` instead."""
    vendor_data_volume: str
    """The same volume id, known when the component is built (the snippet's name never changes): give it to a VM
    with ``vendor_data_snippet`` in its ``opts.depends_on``, so a new vendor-data text (a library upgrade) replaces
    the snippet without touching a VM."""
    vendor_data_snippet: pulumi.Resource
    """The snippet itself, for ``depends_on`` (an ordering edge: the engine never replaces a dependent for it)."""
    image_file_ids: pulumi.Output[dict[str, str]]
    """Cloud image URL -> volume id."""

    def __init__(self, name: str, args: WorkerBootFilesArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        """``opts``: the Proxmox provider in ``opts.provider`` (the children inherit it); ``opts.depends_on`` reaches
        every file."""
        require_cli()  # before anything registers
        super().__init__("proxmox-gpu-cluster:boot_files:WorkerBootFiles", name, None, opts)
        scope = args.scope or current_scope()
        node_name = args.node_name
        child = pulumi.ResourceOptions(parent=self, depends_on=caller_dependencies(opts))
        snippet = proxmoxve.FileLegacy(
            f"{name}-vendor-data",
            proxmoxve.FileLegacyArgs(
                node_name=node_name,
                datastore_id=args.snippet_datastore,
                content_type="snippets",
                source_raw=proxmoxve.FileLegacySourceRawArgs(
                    data=vendor_data(), file_name=scope.snippet_file_name(node_name)
                ),
            ),
            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(delete_before_replace=True)),
        )
        ids: dict[str, pulumi.Output[str]] = {}
        for image in args.images:
            url = image.cloud_image_url
            if url is None or url in ids:
                continue
            download = proxmoxve.download.File(
                # By URL, not by position: adding a worker with another image renames nothing.
                f"{name}-image-{short_hash(url, 8)}",
                proxmoxve.download.FileArgs(
                    node_name=node_name,
                    datastore_id=image.datastore,
                    content_type="iso",
                    url=url,
                    file_name=scope.image_file_name(node_name, image.datastore, url),
                    checksum=image.checksum,
                    checksum_algorithm="sha256" if image.checksum else None,
                    # A new upstream build of the same URL must not replace the disks cloned from it.
                    overwrite=False,
                    overwrite_unmanaged=True,
                ),
                opts=child,
            )
            ids[url] = download.id
        self.vendor_data_file_id = snippet.id
        self.vendor_data_snippet = snippet
        # The id the provider gives the snippet, "<datastore>:snippets/<file name>" (bpg/terraform-provider-proxmox
        # v0.111.1 proxmoxtf/resource/file.go, fileVolumeID.String), known now: its name never changes.
        self.vendor_data_volume = f"{args.snippet_datastore}:snippets/{scope.snippet_file_name(node_name)}"
        self.image_file_ids = pulumi.Output.all(**ids) if ids else pulumi.Output.from_input({})
        self.register_outputs({"vendorDataFileId": self.vendor_data_file_id, "imageFileIds": self.image_file_ids})
