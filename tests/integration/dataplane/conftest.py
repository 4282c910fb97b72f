"""Fresh network namespaces for dataplane kernel tests; never the host's own.

Every iptables/ipset command in these tests goes through a
:class:`SubprocessRunner` bound to a namespace created here, and the fixtures
delete those namespaces (and with them their tables and sets) even when a test
fails.
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from felix.dataplane.backend import LEGACY, LEGACY_IPTC, NFT, Backend
from felix.dataplane.runner import SubprocessRunner
from lab import netns
from tests.integration.conftest import _children, _host_network, _mounts

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


@pytest.fixture(autouse=True)
def no_leftovers() -> Iterator[None]:
    """The integration tier's leftover check, narrowed to this folder's namespaces.

    Other sessions on a shared host create and delete their own namespaces
    while these tests run; counting those made the parent check fail here for
    nothing. Mounts, child processes and the host's links and routes are
    checked exactly as the parent fixture does.
    """
    me = os.getpid()
    netns_before, mounts_before, kids_before = (
        set(netns.list_netns(PREFIX)),
        _mounts(),
        _children(me),
    )
    host_before = _host_network()
    yield
    new_netns = set(netns.list_netns(PREFIX)) - netns_before
    new_kids = {p for p in _children(me) - kids_before if Path(f"/proc/{p}").exists()}
    assert not new_netns, f"test left network namespaces behind: {sorted(new_netns)}"
    assert not _mounts() - mounts_before, "test left mounts behind"
    assert not new_kids, f"test left processes behind: {sorted(new_kids)}"
    assert _host_network() == host_before, "test changed the host's own links or routes"
