"""A slice of the release-state properties (tests/unit/test_release_properties.py)
against the real distribution registry on 127.0.0.1: the same state machine (two hosts,
crashes at any request, one command run inside another, dry runs), fewer and shorter
runs, the registry's own clock (`Date`) with a 2 s lease TTL. Each example uses its own
pair of repositories."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from tests.support.memregistry import FaultSession
from tests.unit.test_release_properties import ReleaseState

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_release_state_invariants_hold_against_distribution(registry, monkeypatch):
    monkeypatch.setenv("IMAGEBUILD_LEASE_TTL", "2")

    class OnDistribution(ReleaseState):
        def make_registry(self):
            ns = uuid.uuid4().hex[:10]
            self.repos = (f"props-{ns}/a", f"props-{ns}/b")
            return FaultSession(registry.url, registry.user, registry.password)

    run_state_machine_as_test(OnDistribution, settings=settings(
        max_examples=5, stateful_step_count=8, deadline=None, derandomize=True, database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]))
