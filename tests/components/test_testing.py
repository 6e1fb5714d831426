"""The public recording mock: parents, providers, dependencies, options, secrets, invokes, outputs."""

from __future__ import annotations

import gc
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import pytest

from proxmox_gpu_cluster.testing import REDACTED, DuplicateUrnError, RecordingMocks, is_secret, redact, run


class Widget(pulumi.ComponentResource):
    def __init__(self, name: str, provider: k8s.Provider, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("test:widget:Widget", name, None, opts)
        ns = k8s.core.v1.Namespace(
            f"{name}-ns", k8s.core.v1.NamespaceInitArgs(), opts=pulumi.ResourceOptions(parent=self, provider=provider)
        )
        self.config_map = k8s.core.v1.ConfigMap(
            f"{name}-cm",
            k8s.core.v1.ConfigMapInitArgs(metadata={"namespace": ns.metadata.name}, data={"k": "v"}),
            opts=pulumi.ResourceOptions(parent=self, provider=provider, protect=True, ignore_changes=["data"]),
        )
        self.register_outputs({"cm": self.config_map.id})


def program() -> None:
    secret = pulumi.Config("demo").require_secret("kubeconfig")
    provider = k8s.Provider("k8s", kubeconfig=secret)
    first = Widget("a", provider)
    Widget("b", provider, opts=pulumi.ResourceOptions(depends_on=[first]))
    pulumi.export("plain", 1)
    pulumi.export("hidden", secret)


def record() -> Any:
    return run(
        program, project="demo", stack="t", config={"demo:kubeconfig": "TOPSECRET"}, secret_keys=["demo:kubeconfig"]
    )


def test_records_tree_providers_and_options() -> None:
    rec = record()
    a = rec.one("test:widget:Widget", "a")
    assert a.parent == rec.stack.urn
    assert sorted(r.name for r in rec.children(a)) == ["a-cm", "a-ns"]
    cm = rec.named("a-cm")
    assert cm.provider == rec.one("pulumi:providers:kubernetes").urn
    assert cm.protect and cm.ignore_changes == ["data"]
    assert cm.inputs["data"] == {"k": "v"}
    assert a.outputs == {"cm": "a-cm-id"}


def test_records_dependencies_transitively() -> None:
    rec = record()
    assert rec.named("a-cm").dependencies == [rec.named("a-ns").urn]
    # b's children wait for everything inside a, through b's depends_on.
    assert rec.depends_on(rec.named("b-cm"), rec.named("a"))
    assert rec.depends_on(rec.named("b-cm"), rec.named("a-cm"))
    assert not rec.depends_on(rec.named("a-cm"), rec.named("b"))


def test_secrets_arrive_as_envelopes_and_redact() -> None:
    rec = record()
    provider = rec.one("pulumi:providers:kubernetes")
    assert is_secret(provider.inputs["kubeconfig"])
    assert provider.plain_inputs["kubeconfig"] == "TOPSECRET"
    assert redact(provider.inputs) == {"kubeconfig": REDACTED}
    assert rec.outputs["plain"] == 1
    assert redact(rec.outputs["hidden"]) == REDACTED


def test_runs_are_independent() -> None:
    first, second = record(), record()
    assert len(first.resources) == len(second.resources) == 8


def test_invoke_hooks_and_missing_hooks() -> None:
    def prog() -> None:
        pulumi.runtime.invoke("demo:index:lookup", {"q": 1})

    rec = run(prog, mocks=RecordingMocks(invokes={"demo:index:lookup": lambda args: {"a": args["q"] + 1}}))
    assert [(i.token, i.args) for i in rec.invokes] == [("demo:index:lookup", {"q": 1})]
    with pytest.raises(Exception, match="no mock result for invoke demo:index:other"):
        run(lambda: pulumi.runtime.invoke("demo:index:other", {}))


def test_program_errors_propagate() -> None:
    def failing() -> None:
        raise pulumi.RunError("bad spec")

    with pytest.raises(pulumi.RunError, match="bad spec"):
        run(failing)


def test_warnings_and_info_are_captured_debug_is_not() -> None:
    def program() -> None:
        pulumi.log.debug("chatter")
        pulumi.log.info("note")
        pulumi.log.warn("careful")

    rec = run(program)
    assert ("warning", "careful") in rec.logs and ("info", "note") in rec.logs
    assert not [m for _, m in rec.logs if m == "chatter"]


def test_a_duplicate_urn_is_refused_like_the_engine_does() -> None:
    def twice() -> None:
        provider = k8s.Provider("k8s")
        Widget("same", provider)
        Widget("same", provider)

    with pytest.raises(DuplicateUrnError, match=r"Duplicate resource URN '.*::same'; try giving it a unique name"):
        run(twice)


def test_the_same_name_under_another_type_is_fine() -> None:
    def program() -> None:
        provider = k8s.Provider("k8s")
        k8s.core.v1.Namespace("x", opts=pulumi.ResourceOptions(provider=provider))
        k8s.core.v1.ConfigMap("x", opts=pulumi.ResourceOptions(provider=provider))

    assert len(run(program).of_type("kubernetes:core/v1:ConfigMap")) == 1


@pytest.mark.parametrize("enabled", [True, False])
def test_the_collector_is_paused_during_a_run_and_restored(enabled: bool) -> None:
    seen: list[bool] = []
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        run(lambda: seen.append(gc.isenabled()))
        assert seen == [False]
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()
