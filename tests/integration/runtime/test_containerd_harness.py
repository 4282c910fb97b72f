"""The runtime harness itself, proved with Debian's reference plugins: containerd inside
a lab node runs the sandbox, then the CNI plugin, and the host side lands in the node."""

from __future__ import annotations

from pathlib import Path

from lab import netns
from lab.runtime import Containerd
from lab.topology import Lab
from tests.integration.runtime.conftest import reference_conflist, write_conflist


def test_run_pod_sandbox_wires_the_pod_into_the_node_not_the_host(
    node_with_containerd: tuple[Lab, Containerd, Path], pause_archive: Path
) -> None:
    lab, runtime, conf_dir = node_with_containerd
    write_conflist(conf_dir, reference_conflist("ref", "10.99.0.0/24", conf_dir.parent / "ipam"))
    runtime.start(pause_archive)

    pod = runtime.run_pod_sandbox("web", "default")
    netns_path = runtime.pod_netns_path(pod)
    addrs = netns.run(["nsenter", f"--net={netns_path}", "ip", "-4", "-o", "addr", "show", "eth0"])
    assert "10.99.0." in addrs
    node_routes = netns.ip(lab.node("node1").netns, "route", "show")
    assert "10.99.0." in node_routes  # ptp's host route is in the node namespace

    runtime.crictl("stopp", pod)
    runtime.crictl("rmp", pod)
    assert "10.99.0." not in netns.ip(lab.node("node1").netns, "route", "show")
    assert runtime.pods() == []
