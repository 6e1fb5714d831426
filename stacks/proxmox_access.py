"""Print the Proxmox commands that create a least-privilege API token for a stack: its roles, a user, the ACL
entries on exactly the paths the spec uses, and the token. Offline: reads the stack file only.

    python -m proxmox_gpu_cluster.stacks.proxmox_access prod [--config FILE] [--user pulumi@pve] [--token NAME]

Run the printed lines as root on one node of the Proxmox cluster (``| bash -e``), then store the token it prints
with ``pulumi config set --secret proxmoxApiToken 'pulumi@pve!NAME=<secret>'``. Run them again after a spec edit
that adds workers, datastores, bridges or nodes: what exists already is left as it is (the token too), what is new
is added. Entries for removed workers are not revoked: ``pveum acl delete`` them when you like.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from pathlib import Path

from proxmox_gpu_cluster.render.proxmox_acl import pveum_commands
from proxmox_gpu_cluster.stacks.cli_checks import OneLineParser, printable
from proxmox_gpu_cluster.stacks.config import InvalidStackConfig
from proxmox_gpu_cluster.stacks.plan.inputs import InputError, find_program, read_inputs
from proxmox_gpu_cluster.stacks.plan.specs import cluster_specs

USER = re.compile(r"^[^\s:!@/]{1,60}@[A-Za-z][A-Za-z0-9.\-_]{1,31}$")
"""``name@realm``, as Proxmox takes a user id (no whitespace, ``:``, ``!`` or ``/`` in the name)."""
TOKEN = re.compile(r"^[A-Za-z][A-Za-z0-9.\-_]{1,127}$")
"""A Proxmox API token id (pve-access-control's token name pattern)."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = OneLineParser(
        prog="python -m proxmox_gpu_cluster.stacks.proxmox_access", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("stack", help="stack name; reads Pulumi.<stack>.yaml unless --config is given")
    parser.add_argument("--config", type=Path, help="stack config file instead of Pulumi.<stack>.yaml")
    parser.add_argument("--main", type=Path, help="the program's directory (default: the current directory)")
    parser.add_argument("--namespace", help="config namespace of the cluster spec (default: the project name)")
    parser.add_argument("--user", default="pulumi@pve", help="the Proxmox user to create (default: pulumi@pve)")
    parser.add_argument("--token", default="gpu-cluster", help="the API token id (default: gpu-cluster)")
    args = parser.parse_args(argv)
    try:
        if not USER.fullmatch(args.user):
            raise InputError(f"--user: expected name@realm, got {args.user[:80]!r}")
        if not TOKEN.fullmatch(args.token):
            raise InputError(f"--token: expected a letter, then letters, digits, '.', '-' or '_'; got {args.token!r}")
        program = find_program(args.main)
        path: Path = args.config or program.directory / f"Pulumi.{args.stack}.yaml"
        namespace = args.namespace or program.project
        specs = cluster_specs(read_inputs(path, [])[0], [namespace])
        if not specs:
            raise InputError(f"{path}: no cluster spec under {namespace}:cluster")
        spec = specs[0].spec
    except (InputError, InvalidStackConfig) as err:
        print(printable(err.lines), file=sys.stderr)
        return 2
    print("\n".join(pveum_commands(spec, args.user, args.token)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
