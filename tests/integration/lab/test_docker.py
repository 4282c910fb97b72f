"""lab/docker.py: Debian's dockerd, run so that nothing of it reaches the host.

A busybox image imported (no registry), a --privileged container run (kind's nodes
are privileged: on this host that needs the capability wrapper), a container on a
user-defined bridge reached from another by name, `docker exec`; then the daemon
stopped with a container still running, and the host compared with its snapshot
from before: links, addresses, routes, iptables (both front ends), nftables, mounts
and cgroups.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from lab import netns
from lab.docker import DockerDaemon, missing_capabilities
from lab.host_snapshot import CGROUP_ROOT, HostSnapshot

pytestmark = pytest.mark.integration

BUSYBOX = Path("/bin/busybox")
IMAGE = "tabby.local/busybox:test"


def busybox_rootfs() -> bytes:
    """A root filesystem of one static busybox and the applets' names."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        tar.add(BUSYBOX, "bin/busybox")
        for applet in ("sh", "sleep", "ip", "nc", "cat", "hostname", "true"):
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type, link.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(link)
    return data.getvalue()


def test_dockerd_runs_privileged_and_networked_containers_and_leaves_no_trace(
    tmp_path: Path,
) -> None:
    if not BUSYBOX.exists():
        pytest.skip("busybox-static is not installed (hack/install-deps.sh)")
    before = HostSnapshot.take()
    daemon = DockerDaemon.start(tmp_path / "dockerd")
    try:
        daemon.docker("import", "-", IMAGE, stdin=busybox_rootfs())
        # kind runs every node --privileged; this host's bounding set lacks a capability
        assert daemon.dropped == missing_capabilities()
        run = daemon.docker(
            "run", "--rm", "--privileged", IMAGE, "sh", "-c", "echo up", check=False
        )
        assert run.returncode == 0, run.stderr.decode() + daemon.log_tail()
        assert run.stdout.decode().strip() == "up"

        # a user-defined bridge network (kind's): one container reaches another by name
        daemon.docker("network", "create", "probe-net")
        server = ["run", "-d", "--name", "server", "--network", "probe-net", IMAGE]
        daemon.docker(*server, "sh", "-c", "while true; do echo hi | nc -l -p 8080; done")
        assert daemon.docker("exec", "server", "hostname").stdout.decode().strip()
        client = ["run", "--rm", "--network", "probe-net", IMAGE]
        got = daemon.docker(*client, "sh", "-c", "nc server 8080 </dev/null", timeout=60)
        assert got.stdout.decode().strip() == "hi"

        # its bridges and NAT rules live in its own namespace: the host's are untouched;
        # the host sees only that namespace's file and the cgroup parent (removed at stop)
        own = (f"mounts: new {netns.NETNS_DIR / daemon.netns} ", "cgroups: new ")
        inside = before.differences(HostSnapshot.take())
        assert [d for d in inside if not d.startswith(own)] == [], inside
        assert (CGROUP_ROOT / "pids" / daemon.cgroup_parent).is_dir()
        daemon.docker("run", "-d", "--privileged", "--name", "left", IMAGE, "sleep", "600")
    finally:
        daemon.stop()
    assert before.differences(HostSnapshot.take()) == []
    assert not (CGROUP_ROOT / "pids" / daemon.cgroup_parent).exists()
    assert not netns.exists(daemon.netns)


def test_missing_capabilities_are_read_from_the_bounding_set() -> None:
    everything = "CapBnd:\t000001ffffffffff\n"
    assert missing_capabilities(everything) == []
    this_host = "CapBnd:\t000001fffeffffff\n"  # the machine of issue 41: no CAP_SYS_RESOURCE
    assert missing_capabilities(this_host) == ["CAP_SYS_RESOURCE"]
