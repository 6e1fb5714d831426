"""host_qm.sh, the JSON reading shared by retire_vm.sh and mig_restart.sh, on what ``qm guest exec`` prints
(fakeqm.py follows qemu-server's qm.pm): one object on stdout; a timeout warning belongs to stderr, not the JSON."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.components.scripts.fakeroot import SCRIPTS
from tests.support import external


def call(function: str, *args: str) -> subprocess.CompletedProcess[str]:
    external(Path("/usr/bin/perl"), "perl", "install it with: apt-get install perl")
    script = f'source "{SCRIPTS / "host_qm.sh"}"; {function} "$@"'
    return subprocess.run(["bash", "-c", script, "host_qm", *args], capture_output=True, text=True, check=False)


RESULT = json.dumps({"exitcode": 3, "exited": 1, "out-data": "line one\nline 'two' $HOME\n"}, indent=3)


@pytest.mark.parametrize(
    ("text", "is_object"),
    [(RESULT, True), ('{"pid": 4242}', True), ("timeout reached, returning pid\n{\"pid\": 1}", False), ("[1]", False),
     ("", False)],
)  # fmt: skip
def test_only_one_json_object_counts(text: str, is_object: bool) -> None:
    assert (call("qm_json_object", text).returncode == 0) is is_object


def test_fields_come_back_as_they_were_and_absent_ones_empty() -> None:
    assert call("qm_json_field", RESULT, "out-data").stdout == "line one\nline 'two' $HOME\n"
    assert call("qm_json_field", RESULT, "exitcode").stdout == "3"
    assert call("qm_json_field", RESULT, "pid").stdout == ""
