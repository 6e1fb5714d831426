"""proxmox-gpu-cluster components: the spec, the GPU catalog and the Pulumi components built on them.

The spec, catalog, validation and capacity modules are pure (no Pulumi import); ``components.testing`` is the
recording mock for unit tests of programs that use these components.
"""

from components.catalog import CATALOG, GpuModel, MigProfile
from components.errors import Problem, SpecError
from components.spec import ClusterSpec, load_spec

__all__ = ["CATALOG", "ClusterSpec", "GpuModel", "MigProfile", "Problem", "SpecError", "load_spec"]
