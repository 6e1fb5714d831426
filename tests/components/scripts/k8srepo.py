"""The Kubernetes package repositories (pkgs.k8s.io) in their shape, signed, for the join step with the REAL apt,
dpkg and gpg (realapt.py; test_real_apt_join.py).

pkgs.k8s.io serves one flat repository per minor, ``https://pkgs.k8s.io/core:/stable:/v1.NN/deb/ /`` with its
signing key at ``.../deb/Release.key``, versions ``1.NN.P-1.1``. Dependencies as kubernetes/release
cmd/krel/templates/latest/metadata.yaml gives them: kubelet (>= 1.28) depends on kubernetes-cni (>= 1.2.0);
kubeadm (>= 1.32) on nothing, kubeadm 1.30-1.31 on cri-tools (>= 1.30.0); kubectl on nothing. The kubelet spec
(.../kubelet/kubelet.spec) adds util-linux and mount (essential on Debian and Ubuntu: the base archive here has
them). Each minor's repository carries its own cri-tools and kubernetes-cni.

The repositories are signed with a key made for the session (real gpg): apt checks the InRelease signature against
the keyring the step itself fetched and dearmored, so a wrong key fails as it would on a node."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.components.scripts.aptrepo import Package, build, kernel_packages

PATCHES = {"33": ("1.33.5-1.1", "1.33.6-1.1"), "34": ("1.34.1-1.1", "1.34.2-1.1")}
"""Builds per minor, oldest first."""


def minor_packages(minor: str) -> list[Package]:
    """kubelet, kubeadm, kubectl at every patch of ``minor``, and the minor's cri-tools and kubernetes-cni."""
    out = [
        Package("cri-tools", f"1.{minor}.0-1.1", section="admin"),
        Package("kubernetes-cni", "1.7.1-1.1", section="net"),
    ]
    for version in PATCHES[minor]:
        kubeadm_depends = ("cri-tools (>= 1.30.0)",) if int(minor) < 32 else ()
        out += [
            Package("kubelet", version, ("kubernetes-cni (>= 1.2.0)", "util-linux", "mount"), section="net"),
            Package("kubeadm", version, kubeadm_depends, section="admin"),
            Package("kubectl", version, section="admin"),
        ]
    return out


def base_packages() -> list[Package]:
    """What the guest's own archive must have for these: its kernel (realapt.RealAptGuest installs it) and the
    essential packages kubelet names."""
    return [
        *kernel_packages(),
        Package("util-linux", "2.39.3-9ubuntu6", section="utils"),
        Package("mount", "2.39.3-9ubuntu6", section="admin"),
    ]


def signing_key(home: Path) -> str:
    """A new signing key in GnuPG home ``home``; returns its armored public key (what Release.key serves)."""
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    env = {**os.environ, "GNUPGHOME": str(home)}
    subprocess.run(
        ["gpg", "--batch", "--passphrase", "", "--quick-gen-key", "pgc-test-repo <repo@example.invalid>",
         "ed25519", "sign", "never"],
        env=env, check=True, capture_output=True,
    )  # fmt: skip
    return subprocess.run(
        ["gpg", "--batch", "--armor", "--export"], env=env, check=True, capture_output=True, text=True
    ).stdout


def sign(repo: Path, home: Path) -> None:
    """InRelease: the Release file clear-signed with the key in ``home`` (as pkgs.k8s.io's repositories are)."""
    env = {**os.environ, "GNUPGHOME": str(home)}
    subprocess.run(
        ["gpg", "--batch", "--yes", "--clearsign", "-o", str(repo / "InRelease"), str(repo / "Release")],
        env=env, check=True, capture_output=True,
    )  # fmt: skip


def stop_agent(home: Path) -> None:
    """Stop the gpg-agent that key generation and signing started for ``home`` (it would outlive the tests)."""
    subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"], check=False, capture_output=True)


def mirror(root: Path, home: Path) -> Path:
    """The minors' repositories under ``root/v1.NN/`` (mirroring ``https://pkgs.k8s.io/core:/stable:/v1.NN/deb/``),
    each signed, with its ``Release.key``; returns ``root``."""
    try:
        key = signing_key(home)
        for minor in PATCHES:
            repo = build(minor_packages(minor), root / f"v1.{minor}")
            sign(repo, home)
            (repo / "Release.key").write_text(key)
    finally:
        stop_agent(home)
    return root
