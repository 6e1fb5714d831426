"""DCGM fields the spec may name without spelling out their type and help text. Pure data.

Each entry is what a line of dcgm-exporter's metrics CSV needs: the DCGM field identifier, its Prometheus type
and a help string. Help strings must not contain commas: dcgm-exporter reads the file with a CSV parser and
rejects lines that do not have exactly three fields. Field names and meanings follow NVIDIA's DCGM field
identifiers (dcgm_fields.h) as exported by dcgm-exporter.
"""

from __future__ import annotations

from typing import Literal

MetricType = Literal["gauge", "counter", "label"]

KNOWN_FIELDS: dict[str, tuple[MetricType, str]] = {
    "DCGM_FI_DEV_GPU_UTIL": ("gauge", "GPU utilization in percent"),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("gauge", "Memory copy utilization in percent"),
    "DCGM_FI_DEV_FB_USED": ("gauge", "Framebuffer memory used in MiB"),
    "DCGM_FI_DEV_FB_FREE": ("gauge", "Framebuffer memory free in MiB"),
    "DCGM_FI_DEV_GPU_TEMP": ("gauge", "GPU temperature in degrees Celsius"),
    "DCGM_FI_DEV_MEMORY_TEMP": ("gauge", "Memory temperature in degrees Celsius"),
    "DCGM_FI_DEV_POWER_USAGE": ("gauge", "Power draw in watts"),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("counter", "Energy consumed since boot in mJ"),
    "DCGM_FI_DEV_SM_CLOCK": ("gauge", "SM clock in MHz"),
    "DCGM_FI_DEV_MEM_CLOCK": ("gauge", "Memory clock in MHz"),
    "DCGM_FI_DEV_XID_ERRORS": ("gauge", "Value of the last XID error seen"),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": ("counter", "Single-bit volatile ECC errors"),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("counter", "Double-bit volatile ECC errors"),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("counter", "PCIe replay count"),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("gauge", "Ratio of time the graphics engine is active"),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("gauge", "Ratio of cycles the memory interface is busy"),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("gauge", "Ratio of cycles the tensor pipe is active"),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("gauge", "Whether remapping of rows has failed"),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": ("counter", "Rows remapped for uncorrectable errors"),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": ("counter", "Rows remapped for correctable errors"),
}

DEFAULT_FIELDS: tuple[str, ...] = (
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_MEM_CLOCK",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
)
"""The default metric list: everything the alert rules and the dashboard query, plus memory-copy utilization.

It also covers every panel of NVIDIA's DCGM exporter dashboard (Grafana 12239: temperature, power, SM clocks,
utilization, framebuffer, tensor-core activity)."""

ALERT_FIELDS: tuple[str, ...] = (
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
)
"""Fields the alert rules query; the exporter must export them or the alerts can never fire."""

DASHBOARD_FIELDS: tuple[str, ...] = (
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_MEM_CLOCK",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_XID_ERRORS",
)
"""Fields the dashboard's panels query."""
