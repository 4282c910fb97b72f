"""Fixtures for the BGP integration tests: a lab of `tbt-*` namespaces, torn down always."""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Iterator

import pytest

from tests.integration.bgp.bgp_netns import Lab


def _need_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to create network namespaces")
    if shutil.which("ip") is None:
        pytest.skip("needs iproute2")


@pytest.fixture
def lab() -> Iterator[Lab]:
    _need_root()
    lab = Lab(prefix=f"tbt-{secrets.token_hex(3)}-")
    lab.add_switch()
    try:
        yield lab
    finally:
        lab.teardown()
