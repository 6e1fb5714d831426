"""MIG mode in a passthrough VM, faked: NVML (through ``nvidia-smi``) keeps a changed MIG mode pending until the
VM is restarted from Proxmox; mig-manager reports failed while it cannot reset the GPU.

- ``install_mig(guest, modes)``: the guest's ``nvidia-smi`` answers ``--query-gpu=index,mig.mode.current,
  mig.mode.pending --format=csv,noheader`` ("0, Disabled, Enabled"; "[N/A]" for a GPU without MIG) and
  ``-i N -mig 1|0``, which sets the pending mode; the current one follows at once only where the GPU can be reset
  in the guest (``resettable``: "Enabled MIG Mode for GPU <bus>"), else nvidia-smi warns that the mode is pending
  ("Warning: MIG mode is in pending enable state for GPU <bus>:Not Supported", "Reboot the system or try nvidia-smi
  --gpu-reset ...") and exits 0, as it does. Any other call is the guest's usual nvidia-smi stub. The state is
  ``fake-mig`` ("<index> <current> <pending>" lines); a guest reboot (``FakeGuest.reboot``) does not touch it.
- ``operator_driver(guest)``: the same nvidia-smi, only inside the operator's driver root (``chroot``).
- ``install_vm(host, guest)``: ``qm`` on the Proxmox node for the guest's VM: ``status``, ``pending`` (the host's
  ``fake-vm-config`` and ``fake-vm-pending``, ``key: value`` lines, an empty value a deletion; printed as
  pve-guest-common's format_pending does), ``guest cmd ping``,
  ``guest exec`` (as fakekube's ``install_qm``; ``exec_fault`` injects faults into the guest's commands there), ``shutdown`` (--forceStop; ``shutdowns``: what the node ran then) and ``start``. A start after a stop is a
  new QEMU process: the pending configuration becomes current (the guest's /proc/cpuinfo and /proc/meminfo follow
  cores and memory), vfio resets the GPUs, so each pending mode becomes current (unless ``fake-no-reset`` exists on
  the host: a GPU the reset does not reach), and the guest boots (a new boot id). ``restarts(host)`` counts them;
  ``api_down_after_boot`` makes the API server unreachable from the guest until the host's next ``sleep``.
- ``mig_manager(cluster, guest, node)``: one run of mig-manager's reconfigure (NVIDIA/mig-parted) for the
  node's label, without WITH_REBOOT: success when every GPU's mode is current, failed when one is still pending.
- ``operator_world(guest, cluster, node)``: the GPU Operator's driver container and mig-manager on a guest in
  operator driver mode, in time: each guest ``sleep`` (the steps' and the agent's waits) is one tick. After a VM
  start (and at first) no driver runs: no /run/nvidia/driver, no nvidia module, so nothing answers nvidia-smi. At
  tick ``driver_after - 1`` the container's root appears (its nvidia-smi exits 9, "couldn't communicate with the
  NVIDIA driver", as before its module loads), at ``driver_after`` the module is loaded and it answers. From tick
  ``driver_after + manager_after`` mig-manager runs for the node's ``nvidia.com/mig.config`` label, at its start
  and again whenever the label changes (its informer's AddFunc/UpdateFunc): one tick sets the state ``pending``
  and, for every MIG GPU whose CURRENT mode is not the label's (all-disabled: Disabled, any other: Enabled), the
  pending mode (``nvidia-mig-parted apply --mode-only``; current too where the guest can reset the GPU); the next
  reports ``success`` when every current mode is the label's, else ``failed`` (the mode assert fails, then the
  geometry's apply; NVIDIA/mig-parted pkg/mig/reconfigure/reconfigure.go, Run, at v0.13.1/v0.15.0). A VM start
  (``qm start``) resets the GPUs (pending becomes current), clears /run and unloads the driver: the container and
  mig-manager start over, and mig-manager runs for the label once more.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

from tests.components.scripts.fakeguest import FakeGuest
from tests.components.scripts.fakeguest_tools import STUBS
from tests.components.scripts.fakekube import FakeCluster
from tests.components.scripts.fakeqm import FAKE_QM
from tests.components.scripts.fakeroot import FakeRoot

# Hopper (``fake-mig-hopper``): the mode belongs to the loaded driver of this boot (stamped with the boot id in
# sys/module/nvidia/, which a reboot, a driver reload or a VM start takes away): without the stamp every MIG GPU is
# back to Disabled.
_HOPPER_FORGETS = r"""if [ -f "$R/fake-mig-hopper" ] && [ -f "$M" ] && \
   [ "$(cat "$R/sys/module/nvidia/fake-mig-boot" 2>/dev/null)" != "$(cat "$R/proc/sys/kernel/random/boot_id")" ]; then
  awk '$2 != "[N/A]" { $2 = "Disabled"; $3 = "Disabled" } { print }' "$M" > "$M.n"; mv "$M.n" "$M"
  cat "$R/proc/sys/kernel/random/boot_id" > "$R/sys/module/nvidia/fake-mig-boot"
fi
"""
_MIG_SMI = (
    r"""R="$PGC_ROOT"; M="$R/fake-mig"
if [ -f "$R/sys/module/nvidia/version" ] && [ -f "$M" ]; then
"""
    + _HOPPER_FORGETS
    + r"""  case "$*" in
  "--query-gpu=index,mig.mode.current,mig.mode.pending --format=csv,noheader")
    while read -r i c p; do echo "$i, $c, $p"; done < "$M"; exit 0 ;;
  "-i "*" -mig "[01])
    i="$2"; want=Disabled; word=disable; [ "$4" = 1 ] && want=Enabled && word=enable
    line="$(grep "^$i " "$M")" || { echo "No devices were found"; exit 6; }
    bus="00000000:0$((i + 1)):00.0"
    set -- $line
    if [ "$2" = "[N/A]" ]; then echo "Unable to $word MIG Mode for GPU $bus: Not Supported"; exit 3; fi
    cur="$2"; { [ -f "$R/fake-mig-resettable" ] || [ -f "$R/fake-mig-hopper" ]; } && cur="$want"
    awk -v i="$i" -v c="$cur" -v p="$want" '$1 == i { $2 = c; $3 = p } { print }' "$M" > "$M.n"; mv "$M.n" "$M"
    if [ "$cur" = "$want" ]; then echo "$want MIG Mode for GPU $bus"
    else echo "Warning: MIG mode is in pending $word state for GPU $bus:Not Supported"
      echo "Reboot the system or try nvidia-smi --gpu-reset to make MIG mode effective on GPU $bus"; fi
    echo "All done."; exit 0 ;;
  esac
fi
"""
)

_API = r"""
import fcntl, json
def set_api_down(path, down):
    with open(path, "r+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        state = json.load(f)
        state["api_down"] = down
        f.seek(0)
        f.truncate()
        json.dump(state, f)
"""

_QM = (
    _API
    + FAKE_QM
    + r"""
import json, os, shutil, subprocess, sys
ROLLOUT = "proxmox-gpu-cluster.io/rollout"
host, guest, guest_path = sys.argv[1], sys.argv[2], sys.argv[3]
args = sys.argv[4:]
status_file = os.path.join(host, "fake-vm-status")
status = open(status_file).read().strip()
if args[:1] == ["status"]:
    sys.exit(print(f"status: {status}") or 0)
if args[:1] == ["shutdown"]:
    seen = os.path.join(host, "fake-kube")
    if os.path.exists(seen):  # what the node ran as its VM stopped (rule 2: never with workloads, unheld)
        api, node = open(seen).read().split()
        with open(api) as f:
            fcntl.flock(f, fcntl.LOCK_SH)
            state = json.load(f)
        pods = [p["name"] for p in state["pods"] if p["node"] == node and p.get("owner") != "DaemonSet"]
        held = node in state["cordoned"] and bool(state["annotations"].get(node, {}).get(ROLLOUT))
        with open(os.path.join(host, "fake-shutdowns"), "a") as f:
            f.write(json.dumps({"pods": pods, "held": held}) + "\n")
    open(status_file, "w").write("stopped\n")
    sys.exit(0)
if args[:1] == ["start"]:
    if status == "running":
        sys.exit(print(f"VM {args[1]} already running", file=sys.stderr) or 255)
    mig = os.path.join(guest, "fake-mig")
    if os.path.exists(mig) and not os.path.exists(os.path.join(host, "fake-no-reset")):
        rows = [line.split() for line in open(mig).read().splitlines()]
        open(mig, "w").write("".join(f"{i} {p if c != '[N/A]' else c} {p}\n" for i, c, p in rows))
    pending = os.path.join(host, "fake-vm-pending")
    if os.path.exists(pending):  # a new QEMU process runs on the whole configuration: pending becomes current
        conf = os.path.join(host, "fake-vm-config")
        cur = dict(l.split(": ", 1) for l in (open(conf).read().splitlines() if os.path.exists(conf) else []))
        for line in open(pending).read().splitlines():
            key, value = line.split(": ", 1)
            cur.pop(key, None) if value == "" else cur.__setitem__(key, value)
        open(conf, "w").write("".join(f"{k}: {v}\n" for k, v in sorted(cur.items())))
        os.unlink(pending)
        if "cores" in cur:  # what the guest kernel then sees
            open(os.path.join(guest, "proc/cpuinfo"), "w").write(
                "".join(f"processor\t: {i}\n\n" for i in range(int(cur["cores"]))))
        if "memory" in cur:
            open(os.path.join(guest, "proc/meminfo"), "w").write(f"MemTotal: {int(cur['memory']) * 1024 * 97 // 100} kB\n")
    count = os.path.join(host, "fake-vm-restarts")
    n = int(open(count).read()) if os.path.exists(count) else 0
    open(count, "w").write(f"{n + 1}\n")
    boot = os.path.join(guest, "proc/sys/kernel/random/boot_id")
    open(boot, "w").write(f"00000000-0000-4000-8000-{n + 100:012d}\n")
    open(status_file, "w").write("running\n")
    world = os.path.join(guest, "fake-operator.json")
    if os.path.exists(world):  # operator driver mode: /run is a tmpfs; the driver container starts over
        w = json.load(open(world))
        w.update(ticks=0, reconciled=None, running=None)
        open(world + ".n", "w").write(json.dumps(w))
        os.replace(world + ".n", world)
        shutil.rmtree(os.path.join(guest, "run/nvidia"), ignore_errors=True)
        if os.path.exists(os.path.join(guest, "sys/module/nvidia/version")):
            os.unlink(os.path.join(guest, "sys/module/nvidia/version"))
    hook = os.path.join(host, "fake-boot-api-down")
    if os.path.exists(hook):  # the guest reaches no API server for a while after its boot
        set_api_down(open(hook).read().strip(), True)
    sys.exit(0)
if args[:1] == ["pending"]:  # pve-guest-common PVE/GuestHelpers.pm format_pending: cur, then new or del, by key
    def config(name):
        path = os.path.join(host, name)
        lines = open(path).read().splitlines() if os.path.exists(path) else []
        return dict(line.split(": ", 1) for line in lines if ": " in line)
    cur, new = config("fake-vm-config"), config("fake-vm-pending")
    for key in sorted(set(cur) | set(new)):
        if key in cur and new.get(key) == "":
            print(f"del {key}: {cur[key]}")
            continue
        if key in cur:
            print(f"cur {key}: {cur[key]}")
        if key in new:
            print(f"new {key}: {new[key]}")
    sys.exit(0)
if args[:2] == ["guest", "cmd"]:
    agent_gone(host, args[2], status)
    sys.exit(0)
if args[:2] == ["guest", "exec"]:
    agent_gone(host, args[2], status)
    command = [os.path.join(guest, a.lstrip("/")) if a.startswith(("/home/", "/root/")) else a
               for a in args[args.index("--") + 1:]]
    env = {"PATH": guest_path, "PGC_ROOT": guest, "LC_ALL": "C"}
    fault = os.path.join(guest, "fake-exec-fault")
    if os.path.exists(fault):  # exec_fault: inject into the guest's commands of this exec (counted in the guest)
        env["PGC_FAULT_AT"], env["PGC_FAULT_MODE"] = open(fault).read().split()
    guest_exec(host, args, command, env)
sys.exit(print("fake qm: unsupported " + " ".join(args), file=sys.stderr) or 2)
"""
)


def install_mig(guest: FakeGuest, modes: dict[int, str], *, resettable: bool = False, hopper: bool = False) -> None:
    """GPUs by nvidia-smi index with their MIG mode (``Enabled``, ``Disabled`` or ``[N/A]``), current = pending.
    ``hopper``: H100/H200, whose mode applies at once and is lost at every boot (see the module docstring)."""
    guest.write("fake-mig", "".join(f"{i} {m} {m}\n" for i, m in sorted(modes.items())))
    if resettable:
        guest.write("fake-mig-resettable", "")
    if hopper:
        guest.write("fake-mig-hopper", "")
        stamp = guest.root / "sys/module/nvidia/fake-mig-boot"
        if stamp.parent.is_dir():  # the modes above are this boot's
            stamp.write_text(guest.read("proc/sys/kernel/random/boot_id"))
    guest.stub_script("nvidia-smi", _MIG_SMI + STUBS["nvidia-smi"])


def operator_driver(guest: FakeGuest) -> None:
    """The GPU Operator's driver container instead of a host driver: no nvidia-smi on the guest's PATH; the
    container's root at /run/nvidia/driver holds it, reached with ``chroot`` (faked: runs ``<root>/usr/bin/<cmd>``)."""
    stub = guest.bin / "nvidia-smi"
    target = guest.root / "run/nvidia/driver/usr/bin/nvidia-smi"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(stub.read_text())
    target.chmod(0o755)
    stub.unlink()
    guest.stub_script("chroot", 'd="$1"; shift; c="$1"; shift; "$d/usr/bin/$c" "$@"')


def mig_state(guest: FakeRoot) -> dict[int, tuple[str, str]]:
    """Index -> (current, pending), as NVML reports them now (a Hopper GPU's mode gone after a boot)."""
    if (guest.root / "sys/module/nvidia/version").exists():
        script = 'R="$PGC_ROOT"; M="$R/fake-mig"\n' + _HOPPER_FORGETS
        subprocess.run(["sh", "-c", script], env={"PGC_ROOT": str(guest.root), "PATH": "/usr/bin:/bin"}, check=True)
    rows = [line.split() for line in guest.read("fake-mig").splitlines()]
    return {int(i): (c, p) for i, c, p in rows}


_OPERATOR = r"""
import fcntl, json, os, shutil, subprocess, sys
guest, api, node = sys.argv[1:4]
path = os.path.join(guest, "fake-operator.json")
w = json.load(open(path))
w["ticks"] += 1
mig_file = os.path.join(guest, "fake-mig")
smi = os.path.join(guest, "run/nvidia/driver/usr/bin/nvidia-smi")
module = os.path.join(guest, "sys/module/nvidia/version")
if w["ticks"] >= w["driver_after"] - 1 and not os.path.exists(smi):  # the container's root, its module not yet
    os.makedirs(os.path.dirname(smi), exist_ok=True)
    shutil.copy(os.path.join(guest, "fake-operator-smi"), smi)
    os.chmod(smi, 0o755)
if w["ticks"] >= w["driver_after"] and not os.path.exists(module):
    os.makedirs(os.path.dirname(module), exist_ok=True)
    open(module, "w").write(w["version"] + "\n")
if w["ticks"] >= w["driver_after"] + w["manager_after"]:
    with open(api, "r+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        state = json.load(f)
        labels = state.setdefault("labels", {}).setdefault(node, {})
        label, report = labels.get("nvidia.com/mig.config", ""), None
        want = "Disabled" if label == "all-disabled" else "Enabled"
        subprocess.run(["sh", "-c", 'R="$PGC_ROOT"; M="$R/fake-mig"\n' + HOPPER_FORGETS],
                       env={"PGC_ROOT": guest, "PATH": "/usr/bin:/bin"}, check=True)
        rows = [line.split() for line in open(mig_file).read().splitlines()]
        if w["running"] is not None and w["running"] == label:  # the run begun last tick reports
            report = "success" if all(c in ("[N/A]", want) for _, c, _ in rows) else "failed"
            w["running"], w["reconciled"] = None, label
        elif label and label != w["reconciled"]:  # at its start, or a new label: a run begins
            if all(c in ("[N/A]", want) for _, c, _ in rows):
                report, w["reconciled"] = "success", label  # nvidia-mig-parted assert passes: success at once
            else:
                reset = any(os.path.exists(os.path.join(guest, f)) for f in ("fake-mig-resettable", "fake-mig-hopper"))
                rows = [[i, c if c == "[N/A]" else (want if reset else c), p if c == "[N/A]" else want]
                        for i, c, p in rows]
                open(mig_file, "w").write("".join(" ".join(r) + "\n" for r in rows))
                report, w["running"] = "pending", label
        if report is not None:
            labels["nvidia.com/mig.config.state"] = report
            state["version"] = state.get("version", 0) + 1
            state.setdefault("node_versions", {})[node] = str(state["version"])
            state.setdefault("mig_manager_reports", []).append(f"{label}={report}")
            f.seek(0)
            f.truncate()
            json.dump(state, f)
open(path + ".n", "w").write(json.dumps(w))
os.replace(path + ".n", path)
"""


def operator_world(
    guest: FakeGuest, cluster: FakeCluster, node: str, *, driver_after: int = 3, manager_after: int = 2,
    driver_up: bool = False,
) -> None:  # fmt: skip
    """The operator's driver container and mig-manager on ``guest`` (after ``install_mig``), in ticks of the
    guest's ``sleep`` (see the module docstring). ``driver_up``: they run already (mig-manager has reconciled the
    node's current label)."""
    stub = guest.bin / "nvidia-smi"
    guest.write("fake-operator-smi", stub.read_text())
    stub.unlink()
    guest.stub_script("chroot", 'd="$1"; shift; c="$1"; shift; "$d/usr/bin/$c" "$@"')
    module = guest.root / "sys/module/nvidia/version"
    version = module.read_text().strip() if module.exists() else "580.95.05"
    module.unlink(missing_ok=True)
    world = {"ticks": 0, "driver_after": driver_after, "manager_after": manager_after, "version": version,
             "reconciled": None, "running": None}  # fmt: skip
    guest.write("fake-operator.json", json.dumps(world))
    (guest.bin / "fake_gpu_operator.py").write_text(f"HOPPER_FORGETS = {_HOPPER_FORGETS!r}\n" + _OPERATOR)
    guest.stub_script("sleep", f'python3 "{guest.bin}/fake_gpu_operator.py" "{guest.root}" "{cluster.path}" "{node}"')
    if driver_up:
        tick(guest, driver_after + manager_after + 1)


def tick(guest: FakeRoot, n: int = 1) -> None:
    """Let ``n`` ticks pass on the guest (as its ``sleep`` does), without counting as a command of a step."""
    stub = (guest.bin / "sleep").read_text().splitlines()[-1]
    for _ in range(n):
        subprocess.run(["sh", "-c", stub], env={"PATH": "/usr/bin:/bin"}, check=True)


def driver_answers(guest: FakeRoot) -> bool:
    """The operator's driver container answers nvidia-smi (its module loaded)."""
    return (guest.root / "sys/module/nvidia/version").exists() and (
        guest.root / "run/nvidia/driver/usr/bin/nvidia-smi"
    ).exists()


def mig_reports(cluster: FakeCluster) -> list[str]:
    """Every state mig-manager reported (``<label>=<state>``), in order, from the operator world."""
    return list(cluster.state().get("mig_manager_reports", []))


def exec_fault(guest: FakeRoot, at: int | None, mode: str = "fail") -> None:
    """Inject a fault at the ``at``-th stubbed guest command run through ``qm guest exec`` (the host step's guest
    side; counted over every exec of the next host runs), as ``FakeRoot.fault`` does for a step run directly; a kill
    takes the exec's process group, which is the host step's (None: no more faults)."""
    for name in ("fault.count", "fault.hit", "fake-exec-fault"):
        (guest.root / name).unlink(missing_ok=True)
    if at is not None:
        guest.write("fake-exec-fault", f"{at} {mode}")


def install_vm(
    host: FakeRoot, guest: FakeRoot, status: str = "running", *, cluster: FakeCluster | None = None, node: str = ""
) -> None:
    """``qm`` on ``host`` for the one VM that runs ``guest``, as root. With ``cluster`` and ``node``, each
    ``qm shutdown`` records what the node ran then (``shutdowns``)."""
    (host.bin / "qm.py").write_text(_QM)
    if cluster is not None:
        host.write("fake-kube", f"{cluster.path} {node}")
    host.write("fake-vm-status", status + "\n")
    guest_path = f"{guest.bin}:/usr/bin:/bin"
    host.stub_script("qm", f'python3 "{host.bin}/qm.py" "{host.root}" "{guest.root}" "{guest_path}" "$@"')
    host.stub_script("id", 'if [ "$1" = -u ]; then echo 0; else echo root; fi')
    host.stub_script("sleep", ":")


def api_down_after_boot(host: FakeRoot, cluster: FakeCluster) -> None:
    """After each VM start the guest reaches no API server until the host's next ``sleep`` (the network coming up
    while the step waits to try again)."""
    host.write("fake-boot-api-down", str(cluster.path))
    (host.bin / "api.py").write_text(_API + f"\nset_api_down({str(cluster.path)!r}, False)\n")
    host.stub_script("sleep", f'python3 "{host.bin}/api.py"')


def shutdowns(host: FakeRoot) -> list[dict[str, Any]]:
    """Per ``qm shutdown`` (``install_vm`` with a cluster): the node's pods other than DaemonSets' then, and whether
    it was held (cordoned and marked with a rollout slot)."""
    seen = host.root / "fake-shutdowns"
    return [json.loads(line) for line in seen.read_text().splitlines()] if seen.exists() else []


def restarts(host: FakeRoot) -> int:
    """How many times the VM was started again after a stop."""
    count = host.root / "fake-vm-restarts"
    return int(count.read_text()) if count.exists() else 0


def mig_manager(cluster: FakeCluster, guest: FakeRoot, node: str) -> str:
    """One reconfigure run for the node's current label: the state it reports (also set on the node)."""
    pending = any(c != p for c, p in mig_state(guest).values() if c != "[N/A]")
    state = "failed" if pending else "success"
    cluster.set_labels(node, **{"nvidia.com/mig.config.state": state})
    return state
