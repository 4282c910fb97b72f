"""The real-node soak target's readings of CRI answers and of /proc."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.soak.targets import (
    POD_READY_TIMEOUT_S,
    _addresses,
    _descendants,
    _innermost_pid,
    _not_ready_reason,
    _sandbox_pid,
)


def test_addresses_are_the_ipv4_ones_of_ip_o_addr() -> None:
    out = (
        "2: eth0    inet 10.244.1.7/32 scope global eth0\\       valid_lft forever\n"
        "2: eth0    inet 10.244.1.8/26 scope global secondary eth0\n"
    )
    assert _addresses(out) == ["10.244.1.7", "10.244.1.8"]
    assert _addresses("") == []


def test_a_host_network_sandbox_has_no_pid_to_enter() -> None:
    inspected = {
        "status": {"linux": {"namespaces": {"options": {"network": "NODE", "pid": "POD"}}}},
        "info": {"pid": 4242},
    }
    assert _sandbox_pid(inspected) is None
    inspected["status"]["linux"]["namespaces"]["options"]["network"] = "POD"
    assert _sandbox_pid(inspected) == 4242


def test_a_pod_never_ready_is_reported_with_its_phase_and_conditions() -> None:
    pod = {
        "metadata": {"name": "c3-1"},
        "status": {
            "phase": "Pending",
            "conditions": [
                {"type": "Ready", "status": "False", "message": "containers not ready"},
                {"type": "PodScheduled", "status": "True"},
            ],
        },
    }
    reason = _not_ready_reason(pod)
    assert reason.startswith(f"c3-1 not Ready after {POD_READY_TIMEOUT_S:.0f}s (Pending: ")
    assert "Ready=False containers not ready" in reason and "PodScheduled=True" in reason
    assert _not_ready_reason(None) == "the Pod was not found"


def test_descendants_and_innermost_pid_find_a_child_process() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert child.pid in _descendants(os.getpid())
        assert _innermost_pid(child.pid) == child.pid  # same pid namespace as the test
        assert os.getpid() not in _descendants(child.pid)
    finally:
        child.kill()
        child.wait()
    assert _innermost_pid(child.pid) is None
