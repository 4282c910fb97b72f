"""The session's one piece of machine set-up: /run/netns as `ip netns add` leaves it."""

from __future__ import annotations

import pytest

from lab import netns

pytestmark = pytest.mark.integration


def test_run_netns_is_mounted_before_any_test_and_no_namespace_is_left() -> None:
    # The session fixture did it before the first leftover snapshot, so the test
    # that creates a machine's first namespace is not blamed for the mount.
    assert netns.netns_dir_mounted()
    assert not [n for n in netns.list_netns("tabby-setup-")]
