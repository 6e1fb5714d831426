"""The node steps' rolling changes: rollout slots, cordon and drain, and the retirement's entry point (the MIG phases
are mig_manager.py's, on this module's slots).
Runs on the machine (python3 3.10+, stdlib only) with kubeapi.py beside it, as the node itself (kubelet's
kubeconfig: no admin credential reaches the machine; see kubeapi.py for what a node may do).

    cluster.py rollout joined|begin|resume|end|cleanup --node N --api HOST:PORT --kubeconfig FILE --namespace NS ...
    cluster.py retire --node-name N --api-endpoint HOST:PORT --kubeconfig FILE --timeout S [...]

A failure prints ``<step>: <what>: expected <x>, saw <y>`` (the tool's output below) and exits 1; ``rollout joined``
exits 3 for a node not in the cluster. Slots are ConfigMaps <namespace>/proxmox-gpu-cluster-rollout-<i> (i <
maxUnavailable; data: holder, acquireTime, renewTime, leaseDurationSeconds: a node may write no Lease outside
kube-node-lease), taken by an atomic create or a replace at the resourceVersion read: a free one, this node's, or an
expired one whose holder is not cordoned for it. The node's annotation proxmox-gpu-cluster.io/rollout=<slot>, set at
the Node's resourceVersion, marks it as cordoned by a rollout and settles two runs for one node on one slot. Only the
holder releases a slot (a replace to no holder): idempotent. A node a failed change left cordoned keeps its slot
until a later run passes or an operator frees it.
"""

from __future__ import annotations

import datetime
import json
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

if __package__:  # imported as part of the package (type checks)
    from .kubeapi import Failure, Kube, cordon, cordoned, drain, metadata, pause, retire, say
else:  # run from its bundle directory, where kubeapi.py sits beside it (sys.path[0])
    from kubeapi import Failure, Kube, cordon, cordoned, drain, metadata, pause, retire, say  # type: ignore[no-redef,import-not-found]

UTC = datetime.timezone.utc  # noqa: UP017 (datetime.UTC is 3.11+)

NAMESPACE = "proxmox-gpu-cluster"  # the slots' default namespace (kubernetes.drain.slotNamespace)
ANNOTATION = "proxmox-gpu-cluster.io/rollout"
MANAGED = {"app.kubernetes.io/managed-by": "proxmox-gpu-cluster"}
SLOT_PREFIX = "proxmox-gpu-cluster-rollout-"
NOT_JOINED = 3
_TIME = "%Y-%m-%dT%H:%M:%S.%fZ"  # MicroTime, as the API server writes it


@dataclass
class Slot:
    name: str
    holder: str = ""  # a node name, or "" for a free slot (released, or no ConfigMap at all)
    expired: bool = True
    version: str | None = None  # the ConfigMap's resourceVersion, None when there is none
    acquired: str | None = None


def slot_object(slot: Slot, holder: str, seconds: int, namespace: str) -> dict[str, Any]:
    """The slot's ConfigMap: the fields of a Lease's spec, as strings."""
    now = datetime.datetime.now(UTC).strftime(_TIME)
    meta: dict[str, Any] = {"name": slot.name, "namespace": namespace, "labels": dict(MANAGED)}
    if slot.version is not None:
        meta["resourceVersion"] = slot.version
    data = {"leaseDurationSeconds": str(seconds), "renewTime": now}
    if holder:  # acquireTime: when this holder took it
        data.update(holder=holder, acquireTime=(slot.holder == holder and slot.acquired) or now)
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}


class Rollout:
    """The rolling-change slots of one node (see the module's docstring)."""

    def __init__(self, kube: Kube, node: str, *, max_unavailable: int = 1, lease_seconds: int = 3600,
                 wait_seconds: int = 21600, drain_timeout: int = 600, emptydir: int = 1, force: int = 0,
                 poll: int = 5, sleep: Callable[[int], None] = pause, namespace: str = NAMESPACE) -> None:  # fmt: skip
        self.kube, self.node, self.max, self.lease_seconds = kube, node, max_unavailable, lease_seconds
        self.namespace = namespace
        self.wait, self.drain_timeout, self.emptydir, self.force = wait_seconds, drain_timeout, emptydir > 0, force > 0
        self.poll, self.sleep, self.names = poll, sleep, [f"{SLOT_PREFIX}{i}" for i in range(max_unavailable)]

    def node_object(self, name: str = "", required: bool = True) -> dict[str, Any] | None:
        obj: dict[str, Any] | None = self.kube.json("get", "node", name or self.node, "--ignore-not-found")
        if obj is None and required:
            raise Failure("rollout", f"node {name or self.node}", "its Node object", "none (not in the cluster)")
        return obj

    def slots(self) -> dict[str, Slot]:
        """Every slot below maxUnavailable (free when it has no ConfigMap) and every other slot ConfigMap, by name."""
        found = {name: Slot(name) for name in self.names}
        listing = self.kube.json("get", "configmaps", "-n", self.namespace) or {}
        now, items = datetime.datetime.now(UTC), listing.get("items", [])
        for item in (i for i in items if i["metadata"]["name"].startswith(SLOT_PREFIX)):
            name, data = item["metadata"]["name"], item.get("data") or {}
            stamp = data.get("renewTime") or data.get("acquireTime") or "0001-01-01T00:00:00"  # never: expired
            try:
                seen = datetime.datetime.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC)
                expired = (now - seen).total_seconds() > int(data.get("leaseDurationSeconds") or 0)
            except ValueError:  # edited by hand into something else: treated as expired, and rewritten when taken
                expired = True
            version, holder = item["metadata"]["resourceVersion"], data.get("holder") or ""
            found[name] = Slot(name, holder, expired, version, data.get("acquireTime"))
        return found

    def free(self, node: str, slot: str) -> str:  # what frees the slot of a node a failed change left cordoned
        return f"kubectl annotate node {node} {ANNOTATION}- && kubectl -n {self.namespace} delete configmap {slot}"

    def protected(self, slot: Slot) -> bool:  # its holder is still cordoned for it: expiry does not free it
        holder = self.node_object(slot.holder, required=False)
        return metadata(holder).get(ANNOTATION) == slot.name and cordoned(holder)

    def write(self, slot: Slot, holder: str) -> bool:
        """Atomically hold ``slot`` as ``holder`` ("" releases it): False when another write came first."""
        verb = "create" if slot.version is None else "replace"
        body = slot_object(slot, holder, self.lease_seconds, self.namespace)
        code, out, err = self.kube.call(verb, "-f", "-", stdin=json.dumps(body))
        if code and not re.search(r"\((AlreadyExists|Conflict|NotFound)\)", err):
            raise self.kube.failure([verb, "configmap", slot.name], code, err or out)
        return code == 0

    def take(self) -> str | None:
        """One attempt: the slot this node now holds and is marked with, or None when every slot is taken."""
        for _ in range(5):
            node = self.node_object()
            marked, slots = metadata(node).get(ANNOTATION, ""), self.slots()
            own = slots.get(marked) if marked else None
            if own is not None and own.holder in ("", self.node):  # the node's slot: renew it, never take another
                if self.write(own, self.node):
                    return marked
                continue  # another write came first: read again
            order = sorted(slots.values(), key=lambda s: (s.holder != self.node, s.name))
            claimed = next((s.name for s in order if self.eligible(s) and self.write(s, self.node)), None)
            if claimed is None:
                return None
            mark = [f"{ANNOTATION}={claimed}", f"--resource-version={(node or {})['metadata']['resourceVersion']}"]
            code, out, err = self.kube.call("annotate", "node", self.node, "--overwrite", *mark)
            if code == 0:
                return claimed
            if "(Conflict)" not in err:
                raise self.kube.failure(["annotate", "node", self.node], code, err or out)
            now_marked = metadata(self.node_object()).get(ANNOTATION, "")
            if now_marked and now_marked != claimed:  # another run for this node won: give this claim back
                self.release(claimed)
        return None

    def eligible(self, slot: Slot) -> bool:
        free = not slot.holder or (slot.expired and not self.protected(slot))
        return slot.holder == self.node or (slot.name in self.names and free)

    def holders(self) -> str:
        held = ", ".join(
            f"{s.holder} (cordoned by a rollout; if its change failed: {self.free(s.holder, s.name)})"
            if s.holder and self.protected(s) else s.holder or "free"
            for s in self.slots().values() if s.name in self.names
        )  # fmt: skip
        return f"held by {held} (pulumi up --parallel must exceed kubernetes.drain.maxUnavailable)"

    def begin(self, why: str) -> None:
        """Take a slot (bounded wait), mark, cordon and drain the node, then renew the slot."""
        waited = 0
        slot = self.take()
        while slot is None:
            if waited >= self.wait:
                raise Failure("rollout", f"slot for {self.node}", f"one of {self.max} free within {self.wait}s",
                              self.holders())  # fmt: skip
            self.sleep(self.poll)
            waited += self.poll
            slot = self.take()
        say(f"rollout: {self.node} took slot {slot} ({why})")
        cordon(self.kube, self.node)
        say(f"rollout: cordoned {self.node}")
        advice = "nothing on the machine was changed yet: move or relax what blocks it, then run pulumi up again"
        drain(self.kube, self.node, self.drain_timeout, emptydir=self.emptydir, force=self.force, advice=advice,
              sleep=self.sleep, poll=self.poll)  # fmt: skip
        say(f"rollout: drained {self.node}")
        self.resume()

    def resume(self) -> None:
        """Renew the slot of a node cordoned by a rollout (or take it again when it was freed meanwhile)."""
        marked = metadata(self.node_object()).get(ANNOTATION, "")
        if not marked:
            return
        slot = self.slots().get(marked) or Slot(marked)
        if slot.holder in ("", self.node) and self.write(slot, self.node):
            if slot.holder != self.node:
                say(f"rollout: {self.node} took its slot {marked} again")
            return
        say(f"rollout: warning: {self.node} is cordoned for slot {marked}, which {slot.holder or 'nobody'} holds")

    def release(self, name: str, *, err: bool = False) -> bool:
        """Give ``name`` back when this node holds it; a slot it does not hold is never touched."""
        for _ in range(3):
            slot = self.slots().get(name)
            if slot is None or slot.holder != self.node:
                return False
            if self.write(slot, ""):
                say(f"rollout: released slot {name}", err=err)
                return True
        return False

    def end(self) -> None:
        """After a passed change: uncordon a node cordoned by a rollout and give back every slot it holds."""
        if metadata(self.node_object()).get(ANNOTATION):
            cordon(self.kube, self.node, on=False)
            self.kube("annotate", "node", self.node, f"{ANNOTATION}-")
            say(f"rollout: uncordoned {self.node}")
        for slot in self.slots().values():
            if slot.holder == self.node:
                self.release(slot.name)

    def cleanup(self) -> None:
        """After a failed step, say what is true; a cordoned node keeps its slot, one taken before the cordon goes."""
        marked = metadata(node := self.node_object(required=False)).get(ANNOTATION, "")
        keep, slots = (marked if cordoned(node) else ""), self.slots()
        holder = slots.get(keep, Slot(keep)).holder
        if keep and holder == self.node:
            say(f"rollout: {self.node} stays cordoned and keeps its slot {keep} until a later run passes; free it "
                f"with: {self.free(self.node, keep)} (and uncordon it once healthy)", err=True)  # fmt: skip
        elif keep:
            say(f"rollout: {self.node} stays cordoned; its slot {keep} is {'held by ' + holder if holder else 'free'}",
                err=True)  # fmt: skip
        elif marked:
            self.kube("annotate", "node", self.node, f"{ANNOTATION}-")
        for slot in slots.values():
            if slot.holder == self.node and slot.name != keep:
                self.release(slot.name, err=True)


def rollout_of(step: str, o: dict[str, str]) -> Rollout:
    """The node's Rollout from the shell step's ``--flag value`` options (guest_rollout.sh, rollout_agent)."""
    n = {k: int(o.get(k, v)) for k, v in DEFAULTS.items()}
    return Rollout(Kube(step, o["kubeconfig"], o["api"]), o["node"], max_unavailable=n["max_unavailable"],
                   lease_seconds=n["lease_seconds"], wait_seconds=n["wait_seconds"], poll=n["poll"],
                   drain_timeout=n["drain_timeout"], emptydir=n["emptydir"], force=n["force"],
                   namespace=o.get("namespace", NAMESPACE))  # fmt: skip


def options(argv: Sequence[str]) -> dict[str, str]:
    """``--flag value`` pairs as {flag: value} (``--max-unavailable`` as ``max_unavailable``)."""
    pairs = iter(argv)
    return {flag.lstrip("-").replace("-", "_"): value for flag, value in zip(pairs, pairs, strict=False)}


def main(argv: Sequence[str]) -> int:
    """``rollout ACTION`` or ``retire`` and ``--flag value`` pairs (the shell steps checked every value)."""
    command, action = (argv[:1] or [""])[0], (argv[1:2] or [""])[0]
    o = options(argv[2:] if command == "rollout" else argv[1:])
    try:
        if command == "retire":
            retire(Kube("drain", o["kubeconfig"], o["api_endpoint"]), o["node_name"], int(o["timeout"]),
                   emptydir=o.get("delete_emptydir_data", "1") == "1", force=o.get("force") == "1",
                   reset=o.get("kubeadm_reset") == "1")  # fmt: skip
            return 0
        if command != "rollout" or action not in ACTIONS:
            raise Failure("agent", "command", "rollout ACTION or retire", " ".join(argv[:2]) or "none")
        rollout = rollout_of(command, o)
        if action == "joined":
            return 0 if rollout.node_object(required=False) else NOT_JOINED
        elif action == "begin":
            rollout.begin(o.get("why", "a change"))
        else:
            getattr(rollout, action)()
    except Failure as failure:  # after a failure, cleanup adds none of its own: the step's line says what failed
        if action != "cleanup":
            say(f"{failure}\n{failure.output}".rstrip("\n"), err=True)
        return 1
    return 0


ACTIONS = ("joined", "begin", "resume", "end", "cleanup")
DEFAULTS = {"max_unavailable": 1, "lease_seconds": 3600, "wait_seconds": 21600, "drain_timeout": 600,
            "emptydir": 1, "force": 0, "poll": 5}  # fmt: skip

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
