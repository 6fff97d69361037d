"""The suite's hypothesis profile (tests/conftest.py) is the one in force: no per-example deadline and no
timing health check, so that a loaded CI machine fails no property by its time (timing is benchmarks/' job)."""

from __future__ import annotations

from hypothesis import HealthCheck, settings


def test_properties_have_no_deadline_and_no_timing_health_check() -> None:
    default = settings.default
    assert default is not None
    for s in (default, settings(max_examples=3)):  # a test's own settings inherit the profile
        assert s.deadline is None and HealthCheck.too_slow in s.suppress_health_check, s
