"""Shared pytest set-up: integration tests are marked by folder, so `-m` selects tiers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# A loaded 2-core machine makes per-example deadlines flaky; CI replays a fixed
# sequence of examples so that a red run can be reproduced exactly.
settings.register_profile("tabby", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("tabby-ci", parent=settings.get_profile("tabby"), derandomize=True)
settings.load_profile("tabby-ci" if os.environ.get("CI") else "tabby")

INTEGRATION_DIR = Path(__file__).parent / "integration"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if INTEGRATION_DIR in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.integration)
