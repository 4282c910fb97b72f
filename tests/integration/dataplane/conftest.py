"""Fresh network namespaces for dataplane kernel tests; never the host's own.

Every iptables/ipset command in these tests goes through a
:class:`SubprocessRunner` bound to a namespace created here, and the fixtures
delete those namespaces (and with them their tables and sets) even when a test
fails.
"""

from __future__ import annotations

import secrets
import shutil
from collections.abc import Iterator

import pytest

from felix.dataplane.backend import LEGACY, LEGACY_IPTC, NFT, Backend
from felix.dataplane.runner import SubprocessRunner
from lab import netns

PREFIX = "tbt-dp"
NEEDED = ("iptables-nft-restore", "iptables-legacy-restore", "ipset", "ip")


@pytest.fixture(autouse=True)
def _tools() -> None:
    missing = [tool for tool in NEEDED if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"dataplane kernel tests need {missing} (Debian: iptables, ipset, iproute2)")


@pytest.fixture(params=[NFT, LEGACY, LEGACY_IPTC], ids=["nft", "legacy", "legacy-iptc"])
def backend(request: pytest.FixtureRequest) -> Backend:
    backend: Backend = request.param
    return backend


def _new_netns() -> str:
    name = f"{PREFIX}{secrets.token_hex(4)}"
    netns.add(name)
    return name


@pytest.fixture
def ns() -> Iterator[str]:
    """A fresh namespace: its own iptables (both backends) and ipsets."""
    name = _new_netns()
    try:
        yield name
    finally:
        netns.delete(name)


@pytest.fixture
def peer() -> Iterator[str]:
    """A second namespace, to send real packets from."""
    name = _new_netns()
    try:
        yield name
    finally:
        netns.delete(name)


@pytest.fixture
def runner(ns: str) -> SubprocessRunner:
    return SubprocessRunner(netns=ns, timeout=30)
