"""The join step's package work (guest_join.sh) with the REAL apt, dpkg and gpg against signed repositories in the
shape of pkgs.k8s.io (k8srepo.py): the repository and key the step writes, the signature apt checks, the minor's
packages installed together and held, a minor changed before the node joined (up and down), a wrong key, and a
kill at every command. kubeadm itself, systemctl, modprobe and sysctl stay the fakes of fakeguest_tools.py.

How the step's https repository reaches the local one: only the transport is swapped. The apt stubs hand apt a copy
of the step's sources.list.d where ``https://pkgs.k8s.io/core:/stable:/v1.NN/deb/`` reads ``file:<mirror>/v1.NN/``
and the ``signed-by`` keyring path is the one under the guest's root; the curl stub serves the mirror's
Release.key for the same URL. The keyring is the one the step fetched and dearmored with the real gpg."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from proxmox_gpu_cluster.render.guest_scripts import join_args
from tests.components.scripts import k8srepo
from tests.components.scripts.aptrepo import build
from tests.components.scripts.fakeguest import FakeGuest
from tests.components.scripts.realapt import _APT_OPTS, RealAptGuest
from tests.components.scripts.test_guest_bootstrap_scripts import SECRETS, spec
from tests.support import external

pytestmark = pytest.mark.slow

K8S = ("kubelet", "kubeadm", "kubectl")

_PARTS = r"""P="$R/var/lib/pgc-test-apt-parts"; rm -rf "$P"; mkdir -p "$P"
for l in "$R"/etc/apt/sources.list.d/*.list; do
  [ -f "$l" ] || continue
  sed -e 's#https://pkgs\.k8s\.io/core:/stable:/\(v1\.[0-9]*\)/deb/#file:{mirror}/\1/#' -e "s#signed-by=/#signed-by=$R/#" \
    "$l" > "$P/${{l##*/}}"
done
APT_OPTS="$APT_OPTS -o Dir::Etc::SourceParts=$P"
"""

_CURL = r"""url=""; for a in "$@"; do url="$a"; done
case "$url" in
  https://pkgs.k8s.io/core:/stable:/v1.*/deb/Release.key) f="{mirror}/${{url#https://pkgs.k8s.io/core:/stable:/}}"; f="${{f%/deb/Release.key}}/Release.key" ;;
  *) f="" ;;
esac
[ -n "$f" ] && [ -f "$f" ] || {{ echo "curl: (22) The requested URL returned error: 404" >&2; exit 22; }}
cat "$f"
"""


class K8sAptGuest(RealAptGuest):
    """A RealAptGuest whose https Kubernetes repositories are the local ``mirror`` (see the module docstring)."""

    def __init__(self, root: Path, base: Path, mirror: Path) -> None:
        super().__init__(root, base)
        parts = _PARTS.format(mirror=mirror)
        for tool in ("apt-get", "apt-cache", "apt-mark"):
            self.stub_script(tool, _APT_OPTS + parts + f'/usr/bin/{tool} $APT_OPTS "$@"')
        self.stub_script("curl", _CURL.format(mirror=mirror))
        gnupg = root.parent / f"{root.name}-gnupg"
        gnupg.mkdir(mode=0o700)
        self.stub_script("gpg", f'GNUPGHOME="{gnupg}" /usr/bin/gpg "$@"')


@pytest.fixture(scope="session")
def archives(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    for tool, package in (("dpkg-deb", "dpkg"), ("apt-ftparchive", "apt-utils"), ("gpg", "gpg"), ("gpgv", "gpgv")):
        external(Path(f"/usr/bin/{tool}"), tool, f"install it with: apt-get install {package}")
    base = build(k8srepo.base_packages(), tmp_path_factory.mktemp("base") / "repo")
    work = tmp_path_factory.mktemp("k8s")
    return base, k8srepo.mirror(work / "mirror", work / "gnupg")


@pytest.fixture
def guest(tmp_path: Path, archives: tuple[Path, Path]) -> K8sAptGuest:
    return K8sAptGuest(tmp_path / "root", *archives)


def join(guest: K8sAptGuest, minor: int) -> tuple[str, list[str]]:
    r = guest.step("join", *join_args(spec(kubernetesMinor=minor)), secrets=SECRETS)
    assert r.returncode == 0, r.stderr
    return r.stdout, r.calls


def at(guest: K8sAptGuest, version: str) -> None:
    status = guest.status()
    assert {p: status.get(p) for p in K8S} == {p: f"hi {version}" for p in K8S}


def test_the_minors_newest_build_is_installed_from_the_signed_repository_and_held(guest: K8sAptGuest) -> None:
    out, calls = join(guest, 34)
    at(guest, k8srepo.PATCHES["34"][-1])
    status = guest.status()
    assert status["kubernetes-cni"].startswith("ii ")  # kubelet's dependency, from the same repository
    # kubeadm 1.32 and later depend on nothing: crictl, which the verify step runs, is there because it is named.
    assert status["cri-tools"] == "ii 1.34.0-1.1"
    listed = guest.read("etc/apt/sources.list.d/kubernetes.list").strip()
    assert listed == ("deb [signed-by=/etc/apt/keyrings/kubernetes.gpg] https://pkgs.k8s.io/core:/stable:/v1.34/deb/ /")
    assert "join: joined as gpu-a10-1" in out
    again, calls = join(guest, 34)
    assert "kubernetes: packages 1.34 (present)" in again
    assert not [c for c in calls if c.startswith(("apt-get", "curl", "apt-mark hold"))], calls


@pytest.mark.parametrize(("first", "then"), [(33, 34), (34, 33)])
def test_a_minor_changed_before_the_node_joined_moves_the_held_packages(
    guest: K8sAptGuest, first: int, then: int
) -> None:
    # Held packages going up, and down: apt never picks an older version by itself (a downgrade needs a pin above
    # 1000 or an explicit version), so the step names the minor's build.
    join(guest, first)
    (guest.root / "etc/kubernetes/kubelet.conf").unlink()  # the join did not happen: a node not joined yet
    join(guest, then)
    at(guest, k8srepo.PATCHES[str(then)][-1])


def test_a_repository_signed_with_another_key_fails_the_step_naming_apt(
    guest: K8sAptGuest, tmp_path: Path, archives: tuple[Path, Path]
) -> None:
    other = tmp_path / "other"
    shutil.copytree(archives[1], other)
    try:
        k8srepo.signing_key(tmp_path / "other-gnupg")
        k8srepo.sign(other / "v1.34", tmp_path / "other-gnupg")  # InRelease by a key the Release.key is not
    finally:
        k8srepo.stop_agent(tmp_path / "other-gnupg")
    bad = K8sAptGuest(tmp_path / "bad-root", archives[0], other)
    r = bad.step("join", *join_args(spec(kubernetesMinor=34)), secrets=SECRETS)
    assert r.returncode == 1
    assert "join: apt-get update" in r.stderr and "NO_PUBKEY" in r.stderr + r.stdout, r.stderr
    assert bad.status().get("kubeadm") is None
    del guest


def test_a_kill_at_any_command_converges(guest: K8sAptGuest, tmp_path: Path) -> None:
    args = join_args(spec(kubernetesMinor=34))
    ref = K8sAptGuest.copy(guest, tmp_path / "ref")
    calls = ref.step("join", *args, secrets=SECRETS).calls
    want = ref.status()
    assert len(calls) >= 8, calls
    for n in range(1, len(calls) + 1):
        g = K8sAptGuest.copy(guest, tmp_path / f"kill-{n}")
        g.fault(n, "kill")
        g.step("join", *args, secrets=SECRETS)
        g.fault(None)
        r = g.step("join", *args, secrets=SECRETS)
        assert r.returncode == 0, (n, calls[n - 1], r.stderr)
        assert g.status() == want, (n, calls[n - 1])
        shutil.rmtree(g.root)


def test_the_fake_apt_keeps_a_newer_installed_version_as_the_real_one(guest: K8sAptGuest, tmp_path: Path) -> None:
    # The contract of the fake apt-get (fakeguest_apt.py) for an install naming no version while a newer one is
    # installed: kept, with --allow-downgrades or not (what hid the join step's minor going down).
    join(guest, 34)
    new, old = k8srepo.PATCHES["34"][-1], k8srepo.PATCHES["33"][-1]
    list_file = "etc/apt/sources.list.d/kubernetes.list"
    guest.write(list_file, guest.read(list_file).replace("v1.34", "v1.33"))
    fake = FakeGuest(tmp_path / "fake")
    fake.write("var/lib/fake-dpkg/kubeadm", new)
    fake.write("var/lib/fake-archive/kubeadm", f"{old}\n")
    command = "apt-get update -q >/dev/null && apt-get install -y -q --allow-downgrades kubeadm >/dev/null\n"
    for apt in (guest, fake):
        r = apt.run_stdin(command.replace("install", "install --allow-change-held-packages"))
        assert r.returncode == 0, r.stderr
        have = apt.status()["kubeadm"].split()[1] if apt is guest else apt.installed("kubeadm")  # held: "hi"
        assert have == new


def test_a_joined_node_missing_a_package_gets_it_at_its_kubelets_build_without_a_drain(guest: K8sAptGuest) -> None:
    # Nodes joined before the step named cri-tools lack it. The kubelet stays at its build (an older patch here),
    # so nothing is drained: the API server is never asked.
    join(guest, 34)
    old = k8srepo.PATCHES["34"][0]
    r = guest.run_stdin(
        "apt-get purge -y -q cri-tools >/dev/null && apt-get install -y -q --allow-change-held-packages "
        f"--allow-downgrades kubelet={old} kubeadm={old} >/dev/null\n"
    )
    assert r.returncode == 0, r.stderr
    assert "cri-tools" not in guest.status()
    out, calls = join(guest, 34)
    assert f"kubernetes: packages 1.34 completed at the kubelet's build {old}" in out
    status = guest.status()
    assert status["cri-tools"].endswith(" 1.34.0-1.1") and status["kubelet"] == f"hi {old}"
    assert not [c for c in calls if c.startswith(("kubectl", "python3", "kubeadm", "systemctl restart"))]
    again, calls = join(guest, 34)
    assert "kubernetes: packages 1.34 (present)" in again
