"""Test-session settings: under CI the property tests draw a fixed sequence of examples, so a run is reproducible
and a counterexample found while developing cannot turn an unrelated CI run red at random; locally they keep
exploring new examples on every run."""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")
