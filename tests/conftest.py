"""Test-session settings. Under CI the property tests draw a fixed sequence of examples, so a run is reproducible
and a counterexample found while developing cannot turn an unrelated CI run red at random; locally they keep
exploring new examples on every run."""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

# The node agent's bundles that plans write (render/agent_bundle.py) go to a directory of this run, not the user's
# cache; subprocesses (the plan CLI, the benchmarks) inherit it.
if "PGC_AGENT_CACHE" not in os.environ:
    import tempfile

    os.environ["PGC_AGENT_CACHE"] = tempfile.mkdtemp(prefix="pgc-test-agent-cache-")
