"""Device-plugin and mig-parted ConfigMap data, content-addressed names, per-worker config labels."""

from __future__ import annotations

import yaml

from proxmox_gpu_cluster.cluster.adapters import gpu_stack
from proxmox_gpu_cluster.core.spec import ClusterSpec, load_spec
from proxmox_gpu_cluster.render.sharing import DevicePluginConfig, MigConfig
from tests.support import base_spec, shared_reference


def device_plugin_config(spec: ClusterSpec) -> DevicePluginConfig:
    return gpu_stack(spec).device_plugin


def mig_config(spec: ClusterSpec) -> MigConfig:
    return gpu_stack(spec).mig


def test_time_slicing_config() -> None:
    config = device_plugin_config(load_spec(base_spec()))
    name = config.node_config["ts-1"]
    assert name.startswith("time-slicing-4-")
    assert config.node_config["mig-1"] == "default"
    document = yaml.safe_load(config.data[name])
    assert document == {
        "version": "v1",
        "flags": {"migStrategy": "mixed"},
        "sharing": {
            "timeSlicing": {
                "renameByDefault": False,
                "failRequestsGreaterThanOne": False,
                "resources": [{"name": "nvidia.com/gpu", "replicas": 4}],
            }
        },
    }
    assert yaml.safe_load(config.data["default"]) == {"version": "v1", "flags": {"migStrategy": "mixed"}}


def test_changing_replicas_changes_the_configmap_name() -> None:
    before = device_plugin_config(load_spec(base_spec()))
    raw = base_spec()
    raw["workers"][2]["timeSlicing"]["replicas"] = 8
    after = device_plugin_config(load_spec(raw))
    assert after.name != before.name and after.name.startswith("device-plugin-config-")
    assert device_plugin_config(load_spec(base_spec())).name == before.name


def test_mig_with_time_slicing_replicates_mig_resources() -> None:
    raw = base_spec()
    raw["workers"][1]["timeSlicing"] = {"replicas": 2}
    config = device_plugin_config(load_spec(raw))
    document = yaml.safe_load(config.data[config.node_config["mig-2"]])
    assert document["sharing"]["timeSlicing"]["resources"] == [
        {"name": "nvidia.com/mig-1g.5gb", "replicas": 2},
        {"name": "nvidia.com/mig-2g.10gb", "replicas": 2},
        {"name": "nvidia.com/mig-3g.20gb", "replicas": 2},
    ]


def test_named_mig_configs_only_need_no_configmap() -> None:
    raw = base_spec()
    raw["workers"][1]["gpus"] = [{"ref": "a100-1", "mig": "all-balanced"}]
    config = mig_config(load_spec(raw))
    assert config.node_config == {"mig-1": "all-1g.5gb", "mig-2": "all-balanced"}
    assert not config.custom


def test_custom_geometry_configmap_carries_named_and_disabled_configs() -> None:
    config = mig_config(load_spec(base_spec()))
    assert config.custom
    custom = config.node_config["mig-2"]
    assert custom.startswith("custom-") and config.node_config["mig-1"] == "all-1g.5gb"
    document = yaml.safe_load(config.data["config.yaml"])
    assert document["version"] == "v1"
    configs = document["mig-configs"]
    assert configs[custom] == [
        {"devices": [0], "mig-enabled": True, "mig-devices": {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}}
    ]
    assert configs["all-disabled"] == [{"devices": "all", "mig-enabled": False}]
    assert configs["all-1g.5gb"][0]["mig-devices"] == {"1g.5gb": 7}
    assert "0x20F110DE" in configs["all-1g.5gb"][0]["device-filter"]


def test_rendered_named_configs_agree_with_the_operator_defaults() -> None:
    reference = yaml.safe_load(shared_reference("v26.7.0", "default-mig-parted-config.yaml").read_text())
    defaults = yaml.safe_load(reference["data"]["config.yaml"])["mig-configs"]
    ours = yaml.safe_load(mig_config(load_spec(base_spec())).data["config.yaml"])["mig-configs"]
    for name, entries in ours.items():
        if name.startswith("custom-"):
            continue
        for entry in entries:
            filters = set(entry.get("device-filter", []))
            match = next(
                e for e in defaults[name]
                if "device-filter" not in e or filters & set([e["device-filter"]] if isinstance(e["device-filter"], str) else e["device-filter"])
            )  # fmt: skip
            assert match["mig-enabled"] == entry["mig-enabled"]
            assert (match.get("mig-devices") or {}) == (entry.get("mig-devices") or {})
