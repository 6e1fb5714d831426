"""Fixtures shared by the node-step tests against the real apt and dpkg."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.components.scripts.aptrepo import build, ubuntu_nvidia_archive
from tests.support import external


@pytest.fixture(scope="session")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The archive in the shape of Ubuntu's NVIDIA archive (aptrepo.py), built once per test session."""
    for tool, package in (("dpkg-deb", "dpkg"), ("apt-ftparchive", "apt-utils"), ("apt-get", "apt")):
        external(Path(f"/usr/bin/{tool}"), tool, f"install it with: apt-get install {package}")
    return build(ubuntu_nvidia_archive(), tmp_path_factory.mktemp("archive") / "repo")
