"""The fair floor of the plan benchmark: the bench spec's cluster written by hand, as a competent Pulumi user would.

Typed ``*Args`` of pulumi_proxmoxve, pulumi_command and pulumi_kubernetes; the same explicit providers; one
``ComponentResource`` per part with the same parents, ``depends_on``, ``replace_with``, timeouts and aliases; secrets
read from config as secret Outputs and fed to the steps' stdin through ``apply``; each guest step connecting to its
VM's address output; the same stack outputs. It knows nothing of the project's code (no import of it): it reads the
spec's plain JSON from config and hard-codes what the project derives from its catalog for the bench's four GPU
models. What it costs to run under the same mock engine is what Pulumi itself costs for this graph, written well;
``plan_scale.py`` divides the project's plan by it. ``tests/benchmarks/test_fair_floor.py`` keeps the two graphs
equal (``shape.graph_shape``: types, roles, parents, dependency edges, options, input keys, aliases), so the floor
cannot drift.
"""

from .cluster import Cluster, floor_config, program, run_floor
from .shape import graph_shape, role

__all__ = ["Cluster", "floor_config", "graph_shape", "program", "role", "run_floor"]
