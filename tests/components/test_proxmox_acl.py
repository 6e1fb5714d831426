"""The Proxmox roles and ACL entries a spec needs, and the pveum lines that create them: exact paths, idempotent
(run twice against a fake pveum that keeps Proxmox's state and refuses what Proxmox refuses), shellcheck-clean."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

from proxmox_gpu_cluster.core.spec import load_spec
from proxmox_gpu_cluster.render.proxmox_acl import (
    BRIDGE_ROLE,
    DISKS_ROLE,
    DOWNLOAD_ROLE,
    IMAGES_ROLE,
    TEMPLATE_ROLE,
    VM_ROLE,
    proxmox_grants,
    pveum_commands,
)
from proxmox_gpu_cluster.stacks.proxmox_access import main
from tests.support import ROOT, base_spec, external


def grants_of(raw: dict[str, Any]) -> set[tuple[str, str, bool]]:
    return {(g.path, g.role.name, g.propagate) for g in proxmox_grants(load_spec(raw))}


def test_grants_name_exactly_the_paths_the_spec_uses() -> None:
    raw = base_spec()
    spec = load_spec(raw)
    grants = grants_of(raw)
    assert {p for p, r, _ in grants if r == VM_ROLE.name} == {f"/vms/{w.vmid}" for w in spec.workers}
    assert ("/", "PGC-PciList", False) in grants and ("/mapping/pci", "PGC-Mappings", True) in grants
    bridges = {f"/sdn/zones/localnetwork/{w.network.bridge}" for w in spec.workers}
    assert {(p, True) for p, r, prop in grants if r == BRIDGE_ROLE.name} == {(b, True) for b in bridges}
    disks = {f"/storage/{w.datastore}" for w in spec.workers} | {
        f"/storage/{n.snippet_datastore}" for n in spec.proxmox.nodes
    }
    assert {p for p, r, _ in grants if r == DISKS_ROLE.name} == disks
    # No role anywhere else, and nothing propagated but the mappings and the bridges.
    assert all(r in {"PGC-Mappings", "PGC-Bridge"} for _, r, propagate in grants if propagate)


def test_a_template_clone_needs_clone_rights_on_the_template_and_no_download() -> None:
    raw = base_spec()
    for worker in raw["workers"]:
        worker["image"] = {"templateVmid": 9000}
    grants = grants_of(raw)
    assert ("/vms/9000", TEMPLATE_ROLE.name, False) in grants
    assert not {r for _, r, _ in grants} & {IMAGES_ROLE.name, DOWNLOAD_ROLE.name}
    assert "PGC-Images" not in "\n".join(pveum_commands(load_spec(raw)))


FAKE_PVEUM = textwrap.dedent(
    """\
    #!/usr/bin/env python3
    # A fake pveum keeping users, roles, ACL entries and tokens in $PVEUM_STATE, refusing as Proxmox does: a role or
    # user that exists cannot be added again, a token that exists neither; info of a missing token fails.
    import json, os, sys
    path = os.environ["PVEUM_STATE"]
    state = json.load(open(path)) if os.path.exists(path) else {"roles": {}, "users": {}, "acl": [], "tokens": []}
    args = sys.argv[1:]
    def opt(name):
        return args[args.index(name) + 1]
    def fail(message):
        print(message, file=sys.stderr)
        sys.exit(255)
    match args[:2]:
        case ["role", "add"]:
            if args[2] in state["roles"]:
                fail(f"role '{args[2]}' already exists")
            state["roles"][args[2]] = opt("--privs").split(",")
        case ["role", "modify"]:
            state["roles"][args[2]] = opt("--privs").split(",")
        case ["user", "add"]:
            if args[2] in state["users"]:
                fail(f"user '{args[2]}' already exists")
            state["users"][args[2]] = opt("--comment")
        case ["user", "modify"]:
            state["users"][args[2]] = opt("--comment")
        case ["acl", "modify"]:
            assert opt("--roles") in state["roles"] and opt("--users") in state["users"], args
            entry = [args[2], opt("--users"), opt("--roles"), opt("--propagate")]
            if entry not in state["acl"]:
                state["acl"].append(entry)
        case ["user", "token"]:
            token = f"{args[3]}!{args[4]}"
            if args[2] == "info":
                sys.exit(0 if token in state["tokens"] else 2)
            if token in state["tokens"]:
                fail(f"token '{token}' already exists")
            state["tokens"].append(token)
            print(f"value: secret-of-{token}")
        case _:
            fail(f"unknown command {args}")
    json.dump(state, open(path, "w"))
    """
)


def run_lines(lines: list[str], tmp_path: Path) -> tuple[dict[str, Any], str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "pveum").write_text(FAKE_PVEUM)
    (bin_dir / "pveum").chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "PVEUM_STATE": str(tmp_path / "state.json")}
    result = subprocess.run(
        ["bash", "-e"], input="\n".join(lines) + "\n", env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    return json.loads((tmp_path / "state.json").read_text()), result.stdout


def test_the_commands_create_everything_once_and_a_second_run_changes_nothing(tmp_path: Path) -> None:
    spec = load_spec(base_spec())
    lines = pveum_commands(spec, "pulumi@pve", "gpu")
    first, out = run_lines(lines, tmp_path)
    assert out.count("secret-of-pulumi@pve!gpu") == 1
    assert first["tokens"] == ["pulumi@pve!gpu"] and list(first["users"]) == ["pulumi@pve"]
    assert first["roles"]["PGC-VM"] == list(VM_ROLE.privileges)
    expected = {(g.path, g.role.name, "1" if g.propagate else "0") for g in proxmox_grants(spec)}
    assert {(p, r, prop) for p, _, r, prop in first["acl"]} == expected
    second, out = run_lines(lines, tmp_path)
    assert second == first and "secret-of" not in out  # the token is kept, no new secret printed


def test_a_role_that_drifted_is_set_back(tmp_path: Path) -> None:
    lines = pveum_commands(load_spec(base_spec()))
    (tmp_path / "state.json").write_text(
        json.dumps({"roles": {"PGC-VM": ["VM.Audit"]}, "users": {}, "acl": [], "tokens": []})
    )
    state, _ = run_lines(lines, tmp_path)
    assert state["roles"]["PGC-VM"] == list(VM_ROLE.privileges)


def test_the_commands_are_shellcheck_clean(tmp_path: Path) -> None:
    shellcheck = external(Path("/usr/bin/shellcheck"), "shellcheck", "install it with: apt-get install shellcheck")
    script = tmp_path / "access.sh"
    script.write_text("#!/usr/bin/env bash\nset -euo pipefail\n" + "\n".join(pveum_commands(load_spec(base_spec()))))
    result = subprocess.run([str(shellcheck), str(script)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout


def test_the_cli_prints_the_commands_of_a_stack_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["prod", "--main", str(ROOT), "--user", "ops@pve", "--token", "prod"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "pveum acl modify /vms/3101 --users ops@pve --roles PGC-VM --propagate 0" in out
    assert out[-1].endswith("pveum user token add ops@pve prod --privsep 0")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--user", "ops"], "--user: expected name@realm"),
        (["--token", "1 bad"], "--token: expected a letter"),
        (["--config", "/nonexistent.yaml"], "/nonexistent.yaml"),
    ],
)
def test_the_cli_refuses_bad_input_in_one_line(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["prod", "--main", str(ROOT), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.splitlines()) == 1
