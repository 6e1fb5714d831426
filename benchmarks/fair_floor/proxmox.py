"""The Proxmox side of the fair floor: host prep, PCI mappings, boot files, worker VMs."""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_command as command
import pulumi_proxmoxve as proxmoxve

from .common import AGENT, AGENT_DIR, MODELS, VENDOR_DATA, Base, Part, short, ssh, step, wait_args


class ProxmoxParts(Base):
    def host_prep(self, node: dict[str, Any]) -> tuple[Part, command.remote.CopyToRemote]:
        prep = self.part("host_gpu_prep:ProxmoxHostGpuPrep", f"{node['name']}-host-prep")
        conn = ssh(node["sshAddress"], "root", self.key)
        opts = pulumi.ResourceOptions(parent=prep, provider=self.cmd)
        agent = command.remote.CopyToRemote(
            f"{prep.prefix}-agent",
            command.remote.CopyToRemoteArgs(
                connection=conn, source=pulumi.FileArchive(AGENT_DIR), remote_path=AGENT[:-6]
            ),
            opts=opts,
        )
        gpus = " ".join(f"--gpu {g['pciPath']}={MODELS[g['model']]['id']}" for g in node["gpus"])
        owner = f"--owner {pulumi.get_stack()}-0123456789"
        args = f"{owner} --cpu-vendor {node['cpuVendor']} --boot-loader auto --acs-override 0 --reboot-policy when-idle"
        run = command.remote.Command(
            f"{prep.prefix}-prep",
            command.remote.CommandArgs(
                connection=conn,
                create=step("root", "host-prep", f"{args} {gpus}"),
                delete=step("root", "host-prep", f"{owner} --release"),
                add_previous_output_in_env=False,
            ),
            opts=pulumi.ResourceOptions.merge(
                opts, pulumi.ResourceOptions(depends_on=[agent], delete_before_replace=True)
            ),
        )
        wait = command.local.Command(
            f"{prep.prefix}-wait",
            wait_args(node["sshAddress"], run.stdout, [run.stdout]),
            opts=pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(depends_on=[run])),
        )
        verify_args = " ".join([f"--gpu {g['pciPath']}" for g in node["gpus"]])
        verify = command.remote.Command(
            f"{prep.prefix}-verify",
            command.remote.CommandArgs(
                connection=conn, create=step("root", "host-verify", verify_args), triggers=[run.stdout]
            ),
            opts=pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(depends_on=[wait])),
        )
        prep.register_outputs(
            {
                "reboot": run.stdout.apply(lambda o: "reboot: scheduled" in o),
                "groups": verify.stdout.apply(lambda o: dict(line.split("=", 1) for line in o.splitlines())),
            }
        )
        return prep, agent

    def boot_files(self, node: dict[str, Any]) -> tuple[proxmoxve.FileLegacy, proxmoxve.download.File]:
        files = self.part("boot_files:WorkerBootFiles", f"{node['name']}-boot-files")
        popts = pulumi.ResourceOptions(parent=files, provider=self.proxmox)
        snippet = proxmoxve.FileLegacy(
            f"{files.prefix}-vendor-data",
            proxmoxve.FileLegacyArgs(
                node_name=node["name"],
                datastore_id="local",
                content_type="snippets",
                source_raw=proxmoxve.FileLegacySourceRawArgs(
                    data=VENDOR_DATA, file_name=f"pgc-{pulumi.get_stack()}-{node['name']}-vendor-data.yaml"
                ),
            ),
            opts=pulumi.ResourceOptions.merge(popts, pulumi.ResourceOptions(delete_before_replace=True)),
        )
        url = "https://cloud-images.ubuntu.com/jammy/current/jammy-server-cloudimg-amd64.img"
        image = proxmoxve.download.File(
            f"{files.prefix}-image-{short(url)}",
            proxmoxve.download.FileArgs(
                node_name=node["name"],
                datastore_id="local",
                content_type="iso",
                url=url,
                file_name=f"jammy-server-cloudimg-amd64-{short(url + node['name'])}.img",
                overwrite=False,
                overwrite_unmanaged=True,
            ),
            opts=popts,
        )
        files.register_outputs({"vendorDataFileId": snippet.id, "imageFileIds": pulumi.Output.all(image.id)})
        return snippet, image

    def pci(self, node: dict[str, Any], devices: list[Any], prep: Part) -> dict[str, proxmoxve.hardware.mapping.Pci]:
        part = self.part("pci_mapping:GpuPciMappings", f"{node['name']}-pci", depends_on=[prep] if prep else [])
        out = {}
        for gpu in node["gpus"]:
            device = next(d for d in devices if d.id.startswith(gpu["pciPath"]) and d.class_.startswith("0x03"))
            out[gpu["name"]] = proxmoxve.hardware.mapping.Pci(
                f"{part.prefix}-{gpu['pciPath']}",
                proxmoxve.hardware.mapping.PciArgs(
                    name=f"pgc_{pulumi.get_stack()}_{node['name']}_{gpu['name']}",
                    comment=f"proxmox-gpu-cluster {pulumi.get_project()}/{pulumi.get_stack()}: {gpu['model']} "
                    f"{node['name']}/{gpu['name']}",
                    maps=[
                        proxmoxve.hardware.mapping.PciMapArgs(
                            id=MODELS[gpu["model"]]["id"],
                            node=node["name"],
                            path=gpu["pciPath"],
                            iommu_group=device.iommu_group,
                            subsystem_id=f"{device.subsystem_vendor[2:]}:{device.subsystem_device[2:]}",
                        )
                    ],
                ),
                opts=pulumi.ResourceOptions(parent=part, provider=self.proxmox, depends_on=[prep]),
            )
        part.register_outputs({"mappings": pulumi.Output.all(**{n: m.name for n, m in out.items()})})
        return out

    def vm(  # noqa: PLR0917
        self,
        node: dict[str, Any],
        w: dict[str, Any],
        model: str,
        mapping: Any,
        snippet: Any,
        image: Any,
        after: list[pulumi.Resource],
        agent: command.remote.CopyToRemote,
    ) -> tuple[proxmoxve.VmLegacy, pulumi.Output[str]]:
        after = [*after, snippet]  # an ordering edge: the VM reads the snippet's known volume id, not its output
        part = self.part("worker_vm:GpuWorkerVm", f"{w['name']}", depends_on=after)
        large_bar = MODELS[model]["large_bar"]
        ignore = ["hostpcis[*].id", "disks[*].fileId", "clone", "initialization.vendorDataFileId"]
        vm = proxmoxve.VmLegacy(
            f"{part.prefix}-vm",
            proxmoxve.VmLegacyArgs(
                node_name=node["name"],
                vm_id=w["vmid"],
                name=w["name"],
                description="GPU worker managed by proxmox-gpu-cluster",
                tags=[model.lower(), "proxmox-gpu-cluster"],
                on_boot=True,
                started=not large_bar,
                reboot_after_update=False,
                machine="q35",
                bios="ovmf",
                efi_disk=proxmoxve.VmLegacyEfiDiskArgs(
                    datastore_id="local-lvm", file_format="raw", type="4m", pre_enrolled_keys=False
                ),
                cpu=proxmoxve.VmLegacyCpuArgs(cores=8, sockets=1, type="host"),
                memory=proxmoxve.VmLegacyMemoryArgs(dedicated=32768, floating=0),
                agent=proxmoxve.VmLegacyAgentArgs(enabled=True, trim=True),
                operating_system=proxmoxve.VmLegacyOperatingSystemArgs(type="l26"),
                scsi_hardware="virtio-scsi-single",
                serial_devices=[proxmoxve.VmLegacySerialDeviceArgs(device="socket")],
                disks=[
                    proxmoxve.VmLegacyDiskArgs(
                        interface="scsi0",
                        datastore_id="local-lvm",
                        file_id=image.id,
                        size=100,
                        discard="on",
                        iothread=True,
                        ssd=True,
                    )
                ],
                network_devices=[proxmoxve.VmLegacyNetworkDeviceArgs(bridge="vmbr0", model="virtio")],
                hostpcis=[
                    proxmoxve.VmLegacyHostpciArgs(
                        device="hostpci0", mapping=mapping.name, pcie=True, rombar=True, xvga=False
                    )
                ],
                initialization=proxmoxve.VmLegacyInitializationArgs(
                    datastore_id="local-lvm",
                    ip_configs=[
                        proxmoxve.VmLegacyInitializationIpConfigArgs(
                            ipv4=proxmoxve.VmLegacyInitializationIpConfigIpv4Args(address="dhcp")
                        )
                    ],
                    user_account=proxmoxve.VmLegacyInitializationUserAccountArgs(
                        username="ubuntu", keys=self.spec["guest"]["sshPublicKeys"]
                    ),
                    vendor_data_file_id=f"local:snippets/pgc-{pulumi.get_stack()}-{node['name']}-vendor-data.yaml",
                ),
            ),
            opts=pulumi.ResourceOptions(
                parent=part,
                provider=self.proxmox,
                ignore_changes=ignore + (["kvmArguments", "started"] if large_bar else []),
                delete_before_replace=True,
                depends_on=after,
            ),
        )
        address = vm.ipv4_addresses.apply(
            lambda a: next((x for i in a or [] for x in i if not x.startswith("127.")), "")
        )
        if large_bar:
            window = command.remote.Command(
                f"{part.prefix}-large-bar",
                command.remote.CommandArgs(
                    connection=ssh(node["sshAddress"], "root", self.key),
                    create=step("root", "large-bar", f"{w['vmid']} 65536 --address"),
                ),
                opts=pulumi.ResourceOptions(parent=part, provider=self.cmd, depends_on=[vm], replace_with=[vm]),
            )
            address = pulumi.Output.all(address, window.stdout).apply(
                lambda v: next((x[9:] for x in (v[1] or "").splitlines() if x.startswith("address: ")), v[0])
            )
        part.register_outputs({"vmId": vm.vm_id, "ipAddress": address, "nodeName": w["name"]})
        return vm, address
