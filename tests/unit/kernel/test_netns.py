"""The netlink seam's namespace entry: a missing namespace is an error, never created,
and the thread comes back to where it was."""

from __future__ import annotations

import os
import secrets

import pytest

import kernel


def _own_netns() -> tuple[int, int]:
    st = os.stat("/proc/thread-self/ns/net")
    return st.st_dev, st.st_ino


def test_missing_namespace_is_reported_and_not_created() -> None:
    name = f"tbt-missing-{secrets.token_hex(4)}"
    before = _own_netns()
    with pytest.raises(kernel.NetnsMissing, match=name), kernel.iproute(name):
        pass
    with pytest.raises(kernel.NetnsMissing, match=name), kernel.fast_rtnl(name):
        pass
    assert not kernel.netns_exists(name)
    assert not os.path.exists(kernel.netns_path(name))
    assert _own_netns() == before


def test_none_means_the_callers_own_namespace() -> None:
    before = _own_netns()
    with kernel.in_netns(None):
        assert _own_netns() == before
    factory = kernel.iproute_factory(None)
    with factory() as ipr:
        assert ipr.link_lookup(ifname="lo")


def test_paths_and_names() -> None:
    assert kernel.netns_path("/proc/1/ns/net") == "/proc/1/ns/net"
    assert kernel.netns_path("pod-a") == "/var/run/netns/pod-a"
    assert not kernel.netns_exists("")
