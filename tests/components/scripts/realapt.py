"""A FakeGuest whose packages are the REAL apt and dpkg (Debian's apt 2.6 / dpkg 1.21 on this machine), each with
its own root under the guest's root, against an archive built by aptrepo.py.

The commands the steps call (apt-get, apt-cache, apt-mark, dpkg, dpkg-query) stay on the stub PATH, so calls are
still recorded and faults injected (fakeroot.py), but each one runs the real tool pointed at the guest's root:
apt with ``-o Dir=<root>`` (its configuration, lists, cache and log under the root), ``Dir::State::status`` (the
root's dpkg database) and ``Dir::Bin::dpkg`` = the dpkg stub, which runs the real dpkg with ``--root=<root>``
(instdir and admindir under it). Packages without maintainer scripts need no chroot. apt's own calls of dpkg
(``--unpack``, then ``--configure``) go through the stub too: each is an injection point, as on a real machine a
kill can land between them.

What stays a model, and why: DKMS cannot build a module here (no kernel tree): after every dpkg call the stub does
what nvidia-dkms's postinst and the headers' ``/etc/kernel/header_postinst.d/dkms`` hook do (``dkms autoinstall``,
canonical/nvidia-graphics-drivers debian/templates/nvidia-dkms-flavour.postinst.in): the module of the configured
nvidia-dkms package's upstream version for every kernel whose headers are configured, in
``/lib/modules/<kernel>/updates/dkms/nvidia.ko`` (where the fake modprobe looks); with no nvidia-dkms configured it
is removed (its prerm: ``dkms remove``). ``kill_apt_after_unpack()``: the dpkg stub kills the run at apt's first
``--configure`` call, after the real unpack (packages ``iU``).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.components.scripts.fakeguest import FakeGuest

# APT_CONFIG: a file that keeps the machine's own /etc/apt/apt.conf{,.d} out (apt reads APT_CONFIG before the
# parts directory, apt.conf(5)); without it the host's hooks (DPkg::Post-Invoke, APT::Update::Post-Invoke) would
# run. The stubs directory is shared by copies of a guest (FakeGuest.copy), so paths into it come from $0.
_APT_OPTS = r"""R="$PGC_ROOT"; B="${0%/*}"; export APT_CONFIG="$B/apt-isolated.conf"
APT_OPTS="-o Dir=$R -o Dir::State::status=$R/var/lib/dpkg/status -o Dir::Bin::dpkg=$B/dpkg -o APT::Sandbox::User=root"
"""
_ISOLATED = 'Dir::Etc::Main "/dev/null";\nDir::Etc::Parts "{parts}";\n'

# The dpkg database and apt's directories a Debian root starts with (dpkg's own postinst creates them).
_DIRS = (
    "var/lib/dpkg/info",
    "var/lib/dpkg/updates",
    "var/lib/dpkg/triggers",
    "var/lib/apt/lists/partial",
    "var/cache/apt/archives/partial",
    "var/log/apt",
    "etc/apt/sources.list.d",
    "etc/apt/preferences.d",
    "etc/apt/apt.conf.d",
)

# dkms autoinstall / remove, after dpkg changed something (see the module docstring).
_DKMS = r"""dkms_model() {
  q="/usr/bin/dpkg-query --admindir=$R/var/lib/dpkg -W"
  v="$($q -f='${db:Status-Status} ${Version}\n' 'nvidia-dkms-*' 2>/dev/null | awk '$1 == "installed" { split($2, u, "-"); print u[1]; exit }')"
  lic="NVIDIA"; $q -f='${db:Status-Status} ${Package}\n' 'nvidia-dkms-*-open' 2>/dev/null | grep -q '^installed ' && lic="Dual MIT/GPL"
  for h in $($q -f='${db:Status-Status}:${Package}\n' 'linux-headers-[0-9]*' 2>/dev/null); do
    case "$h" in installed:*) ;; *) continue ;; esac
    k="${h#installed:linux-headers-}"; ko="$R/lib/modules/$k/updates/dkms/nvidia.ko"
    if [ -n "$v" ]; then mkdir -p "${ko%/*}"; printf "%s\nlicense=%s\n" "$v" "$lic" > "$ko"; else rm -f "$ko"; fi
  done
}
"""

STUBS = {
    "apt-get": _APT_OPTS + '/usr/bin/apt-get $APT_OPTS "$@"',
    "apt-cache": _APT_OPTS + '/usr/bin/apt-cache $APT_OPTS "$@"',
    "apt-mark": _APT_OPTS + '/usr/bin/apt-mark $APT_OPTS "$@"',
    "dpkg-query": 'R="$PGC_ROOT"\n/usr/bin/dpkg-query --admindir="$R/var/lib/dpkg" "$@"',
    # dpkg wants ldconfig and start-stop-daemon on PATH (sbin); the stub PATH has no sbin.
    "dpkg": 'R="$PGC_ROOT"\n'
    + _DKMS
    + r"""case " $* " in *" --configure "*)
  if [ -f "$R/fake-apt-kill-after-unpack" ]; then
    # apt runs dpkg in a session of its own: kill the session of its parent (apt-get), the step's (whose
    # leader's pid is the id of the step's process group), as a dropped SSH session would.
    rm -f "$R/fake-apt-kill-after-unpack"
    read -r _ _ _ ppid _ < /proc/$$/stat; read -r _ _ _ _ _ sid _ < "/proc/$ppid/stat"; kill -9 -"$sid"
  fi ;;
esac
rc=0; PATH="$PATH:/usr/sbin:/sbin" /usr/bin/dpkg --root="$R" "$@" || rc=$?
case " $* " in *" --unpack "*|*" --configure "*|*" --remove "*|*" --purge "*|*" -i "*|*" --install "*) dkms_model ;; esac
exit "$rc"
""",
}


class RealAptGuest(FakeGuest):
    """A FakeGuest (its kernel, modules, boot and GPU models) with the real apt and dpkg and the archive at
    ``repo`` (aptrepo.build); its kernel's image metapackage and image are installed, as on a cloud image."""

    def __init__(self, root: Path, repo: Path) -> None:
        super().__init__(root)
        for name, body in STUBS.items():
            self.stub_script(name, body)
        (self.bin / "apt.conf.d").mkdir()  # empty: no configuration parts at all
        (self.bin / "apt-isolated.conf").write_text(_ISOLATED.format(parts=self.bin / "apt.conf.d"))
        for fake in ("var/lib/fake-dpkg", "var/lib/fake-archive", "var/lib/fake-holds"):
            subprocess.run(["rm", "-rf", str(root / fake)], check=True)
        for d in _DIRS:
            (root / d).mkdir(parents=True, exist_ok=True)
        self.write("var/lib/dpkg/status", "")
        self.write("etc/apt/sources.list", f"deb [trusted=yes] file:{repo} ./\n")
        kernel = self.read("fake-kernel").strip()
        r = self.run_stdin(
            f"apt-get update -q && apt-get install -y -q linux-image-virtual linux-image-{kernel}\n"
            f"apt-mark auto linux-image-{kernel} >/dev/null\n"
        )
        assert r.returncode == 0, r.stderr
        self.log.unlink()

    @classmethod
    def copy(cls, source: FakeGuest, root: Path) -> RealAptGuest:
        """A second guest in ``source``'s state (its dpkg database and apt state are files under the root)."""
        guest = super().copy(source, root)
        assert isinstance(guest, RealAptGuest)
        return guest

    def installed(self, package: str) -> str | None:
        """The version dpkg has configured (``ii``), or None."""
        r = self.run_stdin(f"dpkg-query -W -f='${{db:Status-Abbrev}} ${{Version}}' {package} 2>/dev/null || true\n")
        status, _, version = r.stdout.partition(" ")
        return version.strip() if status.strip() == "ii" else None

    def holds(self) -> list[str]:
        return self.run_stdin("apt-mark showhold\n").stdout.split()

    def status(self) -> dict[str, str]:
        """Every package dpkg knows: name -> "<status abbrev> <version>"."""
        r = self.run_stdin("dpkg-query -W -f='${db:Status-Abbrev}|${Package}|${Version}\\n'\n")
        out = {}
        for line in r.stdout.splitlines():
            abbrev, name, version = line.split("|")
            if version:
                out[name] = f"{abbrev.strip()} {version}"
        return out

    def publish(self, repo: Path) -> None:
        """Point the guest at another archive (a new snapshot of the mirror); the next apt-get update reads it."""
        self.write("etc/apt/sources.list", f"deb [trusted=yes] file:{repo} ./\n")
