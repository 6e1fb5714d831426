"""proxmox-gpu-cluster: load the stack's spec and secrets, build everything, export the results."""

from stacks.build import build, export
from stacks.config import load

spec, secrets = load()
export(build(spec, secrets))
