"""Pod wiring is desired state: drift is repaired, a restart never destroys a live pod.

Issue 21 items 3, 6 and 10, against the real tabby-node, apiserver and kernel
namespaces, the way an operator, a runtime and a tenant meet them:

- ``ip route del <pod>/32`` (and a reset ``proxy_arp``) on a node: the next resync
  puts them back and the pod is reachable again;
- the same deletion followed by an agent restart: the pod keeps its veth, its
  address and its IPAM handle (recovery decides by owner, not by route);
- CHECK without prevResult after a restart knows the pods wired before it;
- ADD for a second interface of a wired container is refused and eth0 survives;
- a bad ADD with a 4 KB container id copies no long id into an Event or the log.
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from datastore import kinds
from felix.wiring import host_ifname_for
from ipam.allocator import IPAMAllocator
from lab import netns
from tests.integration.agent.test_agent_restart import NETWORK, RestartableAgent, _create_pod
from tests.integration.agent.test_agent_restart import (  # noqa: F401  (the fixture, by its name)
    restartable_agent as _restartable_agent,
)

pytestmark = pytest.mark.integration

RESYNC_S = 2.0


@pytest.fixture
def agent(_restartable_agent: RestartableAgent) -> RestartableAgent:  # noqa: F811
    """test_agent_restart's node whose tabby-node this test starts and kills."""
    return _restartable_agent


def _cni(
    agent: RestartableAgent,
    command: str,
    container_id: str,
    pod_netns: str,
    pod: str,
    ifname: str = "eth0",
) -> tuple[int, dict[str, Any]]:
    """The installed plugin run in the node namespace, as a runtime runs it."""
    an = agent.node
    env = {
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": container_id,
        "CNI_IFNAME": ifname,
        "CNI_PATH": str(an.bin_dir),
        "CNI_NETNS": f"/run/netns/{pod_netns}",
        "CNI_ARGS": f"K8S_POD_NAMESPACE=default;K8S_POD_NAME={pod};IgnoreUnknown=1",
    }
    proc = subprocess.run(
        ["ip", "netns", "exec", an.node.netns, str(an.bin_dir / "tabby")],
        input=json.dumps(an.network_config()),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return proc.returncode, (json.loads(proc.stdout) if proc.stdout.strip() else {})


def _pod(agent: RestartableAgent, label: str) -> tuple[str, str, str, ipaddress.IPv4Address]:
    """A Pod object, its sandbox netns and a successful ADD: (name, netns, cid, address)."""
    name = f"{label}-{agent.node.lab.lab_id}"
    _create_pod(agent.node.datastore, name, agent.node_name)
    agent.pods.append(name)
    pod_ns = agent.node.lab.ns(label)
    netns.add(pod_ns)
    cid = uuid.uuid4().hex
    code, result = _cni(agent, "ADD", cid, pod_ns, name)
    assert code == 0, result
    return name, pod_ns, cid, ipaddress.ip_interface(result["ips"][0]["address"]).ip


def _pings(src_ns: str, address: ipaddress.IPv4Address) -> bool:
    out = subprocess.run(
        ["ip", "netns", "exec", src_ns, "ping", "-c", "1", "-W", "1", str(address)],
        capture_output=True,
        timeout=10,
        check=False,
    )
    return out.returncode == 0


def _eventually(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:.0f}s: {what}")
        time.sleep(0.2)


def _sysctl(node_ns: str, key: str, value: str | None = None) -> str:
    path = f"/proc/sys/net/{key}"
    if value is not None:
        netns.ns_exec(node_ns, ["sh", "-c", f"echo {value} > {path}"])
    return netns.ns_exec(node_ns, ["cat", path]).strip()


def _kill(agent: RestartableAgent) -> None:
    proc = agent.node.agent
    assert proc.pid is not None and proc.alive()
    os.kill(proc.pid, signal.SIGKILL)  # by PID: the agent process this test started
    assert proc.proc is not None
    proc.proc.wait(timeout=10)


def _recovery_report(agent: RestartableAgent) -> dict[str, Any]:
    log = agent.node.agent.log_path.read_text(errors="replace")
    line = next(ln for ln in log.splitlines() if "recovery after restart" in ln)
    return dict(json.loads(line)["recovery"])


def test_a_deleted_pod_route_and_proxy_arp_are_repaired_within_a_resync(
    agent: RestartableAgent,
) -> None:
    agent.args += ["--resync-interval", str(RESYNC_S)]
    agent.start()
    node_ns = agent.node.node.netns
    _, client_ns, _, _ = _pod(agent, "client")
    name, pod_ns, _, address = _pod(agent, "server")
    host = host_ifname_for("default", name)
    _eventually(lambda: _pings(client_ns, address), 20, "client reaches server")

    netns.ip(node_ns, "route", "del", f"{address}/32")
    assert _sysctl(node_ns, f"ipv4/conf/{host}/proxy_arp", "0") == "0"
    netns.ip(pod_ns, "neigh", "flush", "all")  # the gateway must be resolved again

    _eventually(
        lambda: "proto 80" in netns.ip(node_ns, "route", "show", f"{address}/32"),
        RESYNC_S * 5,
        f"route {address}/32 back",
    )
    _eventually(
        lambda: _sysctl(node_ns, f"ipv4/conf/{host}/proxy_arp") == "1",
        RESYNC_S * 5,
        "proxy_arp back",
    )
    _eventually(lambda: _pings(client_ns, address), 10, "client reaches server again")


def test_a_pod_whose_route_was_deleted_survives_an_agent_restart(
    agent: RestartableAgent,
) -> None:
    agent.start()
    node_ns = agent.node.node.netns
    _, client_ns, _, _ = _pod(agent, "client")
    name, pod_ns, cid, address = _pod(agent, "server")
    host = host_ifname_for("default", name)
    handle = f"{NETWORK}.{cid}"
    _eventually(lambda: _pings(client_ns, address), 20, "client reaches server")

    netns.ip(node_ns, "route", "del", f"{address}/32")
    _kill(agent)
    agent.start()

    report = _recovery_report(agent)
    assert handle not in report["released"], report
    assert host not in report["removed_links"], report
    assert f"{address}/32" in netns.ip(pod_ns, "-4", "addr", "show", "eth0")
    assert host in netns.ip(node_ns, "-o", "link", "show", host)
    allocator = IPAMAllocator(agent.node.datastore, agent.node_name)
    assert allocator.addresses_of(handle) == [address], "the live pod's address was released"
    _eventually(lambda: _pings(client_ns, address), 20, "client reaches server after restart")
    annotations = agent.node.datastore.get_raw(kinds.POD, name, "default")["metadata"]
    assert annotations["annotations"]["tabby.dev/podIP"] == f"{address}/32"


def test_check_without_prev_result_knows_pods_wired_before_a_restart(
    agent: RestartableAgent,
) -> None:
    agent.start()
    name, pod_ns, cid, _ = _pod(agent, "checked")
    assert _cni(agent, "CHECK", cid, pod_ns, name) == (0, {})
    _kill(agent)
    agent.start()
    code, answer = _cni(agent, "CHECK", cid, pod_ns, name)
    assert code == 0, answer
    # ... and still names real drift after the restart
    netns.ip(pod_ns, "link", "set", "eth0", "down")
    code, answer = _cni(agent, "CHECK", cid, pod_ns, name)
    assert code != 0 and answer["code"] == 100 and "down" in answer.get("details", ""), answer


def test_a_second_interface_is_refused_and_the_first_stays_wired(
    agent: RestartableAgent,
) -> None:
    agent.start()
    node_ns = agent.node.node.netns
    name, pod_ns, cid, address = _pod(agent, "multi")
    host = host_ifname_for("default", name)
    index = netns.ip(node_ns, "-o", "link", "show", host).split(":")[0]

    code, answer = _cni(agent, "ADD", cid, pod_ns, name, ifname="eth1")
    assert code != 0, f"eth1 ADD succeeded: {answer}"
    assert answer["code"] == 4 and "eth0" in answer["msg"] and "eth1" in answer["msg"], answer
    links = netns.ip(pod_ns, "-o", "link", "show")
    assert "eth1" not in links and "eth0" in links
    assert netns.ip(node_ns, "-o", "link", "show", host).split(":")[0] == index, "veth replaced"
    assert f"{address}/32" in netns.ip(pod_ns, "-4", "addr", "show", "eth0")
    assert _cni(agent, "CHECK", cid, pod_ns, name) == (0, {})

    # A repeated ADD of the same (container, interface) is still idempotent.
    code, again = _cni(agent, "ADD", cid, pod_ns, name)
    assert code == 0 and ipaddress.ip_interface(again["ips"][0]["address"]).ip == address
    # After eth0's DEL the container may be attached on eth1.
    assert _cni(agent, "DEL", cid, pod_ns, name)[0] == 0
    code, other = _cni(agent, "ADD", cid, pod_ns, name, ifname="eth1")
    assert code == 0, other
    assert _cni(agent, "DEL", cid, pod_ns, name, ifname="eth1")[0] == 0


def test_a_bad_add_with_a_4kb_container_id_copies_no_long_id_into_events_or_logs(
    agent: RestartableAgent,
) -> None:
    agent.start()
    ds = agent.node.datastore
    name = f"longid-{agent.node.lab.lab_id}"
    _create_pod(ds, name, agent.node_name)
    agent.pods.append(name)
    pod_ns = agent.node.lab.ns("longid")
    netns.add(pod_ns)
    netns.ip(pod_ns, "link", "add", "eth0", "type", "veth", "peer", "name", "xeth0")  # taken
    for cid in ("f" * 4096, "e" * 200):
        code, answer = _cni(agent, "ADD", cid, pod_ns, name)
        assert code != 0, answer
        assert "f" * 100 not in json.dumps(answer) and "e" * 100 not in json.dumps(answer)

    def events() -> list[dict[str, Any]]:
        items, _ = ds.list_raw(kinds.EVENT, "default")
        return [e for e in items if e["involvedObject"]["name"] == name]

    time.sleep(1.0)  # Events are posted before the answer; give the apiserver a moment
    for event in events():
        message = str(event["message"])
        assert "f" * 100 not in message and "e" * 100 not in message, message[:200]
        assert len(message) <= 600, len(message)
    log = agent.node.agent.log_path.read_text(errors="replace")
    long_lines = [ln[:120] for ln in log.splitlines() if "f" * 100 in ln or "e" * 100 in ln]
    assert not long_lines, long_lines
