"""WorkerBootFiles: what a Proxmox node needs to boot its GPU workers: cloud images and the vendor-data snippet."""

from __future__ import annotations

import posixpath
import re
from urllib.parse import urlparse

import pulumi
import pulumi_proxmoxve as proxmoxve

from components.cloud_init import vendor_data
from components.spec import ClusterSpec

SNIPPET_NAME = "proxmox-gpu-cluster-vendor-data.yaml"


def image_file_name(url: str) -> str:
    """The stored file name: the URL's, with an ``.img`` extension (PVE < 8.4 refuses .qcow2/.raw as iso)."""
    base = posixpath.basename(urlparse(url).path)
    return re.sub(r"\.(qcow2|raw)$", ".img", base)


class WorkerBootFiles(pulumi.ComponentResource):
    """Per node: one download per distinct cloud image its workers use, and the cloud-init vendor-data snippet.

    The snippet is uploaded over SSH by the provider (the API cannot write snippets); the datastore must have
    the ``snippets`` content type enabled.
    """

    vendor_data_file_id: pulumi.Output[str]
    """Volume id of the vendor-data snippet."""
    image_file_ids: pulumi.Output[dict[str, str]]
    """Cloud image URL -> volume id."""

    def __init__(
        self,
        name: str,
        spec: ClusterSpec,
        node_name: str,
        *,
        provider: proxmoxve.Provider,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("proxmox-gpu-cluster:boot_files:WorkerBootFiles", name, None, opts)
        node = spec.node(node_name)
        child = pulumi.ResourceOptions(parent=self, provider=provider)
        snippet = proxmoxve.FileLegacy(
            f"{name}-vendor-data",
            proxmoxve.FileLegacyArgs(
                node_name=node.name,
                datastore_id=node.snippet_datastore,
                content_type="snippets",
                source_raw=proxmoxve.FileLegacySourceRawArgs(data=vendor_data(), file_name=SNIPPET_NAME),
            ),
            opts=child,
        )
        images: dict[str, pulumi.Output[str]] = {}
        for worker in spec.workers:
            image = worker.image
            url = image.cloud_image_url
            if worker.node != node.name or url is None or url in images:
                continue
            download = proxmoxve.download.File(
                f"{name}-image-{len(images)}",
                proxmoxve.download.FileArgs(
                    node_name=node.name,
                    datastore_id=image.datastore,
                    content_type="iso",
                    url=url,
                    file_name=image_file_name(url),
                    checksum=image.checksum,
                    checksum_algorithm="sha256" if image.checksum else None,
                    # A new upstream build of the same URL must not replace the disks cloned from it.
                    overwrite=False,
                ),
                opts=child,
            )
            images[url] = download.id
        self.vendor_data_file_id = snippet.id
        self.image_file_ids = pulumi.Output.all(**images) if images else pulumi.Output.from_input({})
        self.register_outputs({"vendorDataFileId": self.vendor_data_file_id, "imageFileIds": self.image_file_ids})
