"""Agent-side handlers and the socket server, with the kernel replaced by a fake."""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import stat
import threading
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cni import shim
from felix import cni_server, wiring
from felix.cni_server import CNIHandlers, CNIServer, Endpoint, PodKey, parse_request
from felix.cni_server import handlers as cni_handlers
from felix.pool_allocator import PoolAllocator

NET = "k8s-pod-network"


class FakeKernel:
    """Records wire/unwire calls; check() reports whatever the test planted."""

    def __init__(self) -> None:
        self.wired: dict[str, wiring.PodWiring] = {}
        self.unwired: list[tuple[str, str | None, str | None]] = []
        self.problems: list[str] = []
        self.fail_with: Exception | None = None
        self.lock = threading.Lock()

    def wire(self, spec: wiring.PodWiring, node_netns: str | None = None) -> wiring.Wired:
        if self.fail_with:
            raise self.fail_with
        with self.lock:
            self.wired[spec.host_ifname] = spec
        return wiring.Wired(
            spec.host_ifname, "ee:ee:ee:ee:ee:ee", spec.pod_ifname, "0a:00:00:00:00:01"
        )

    def unwire(
        self,
        pod_ifname: str,
        pod_netns: str | None,
        host_ifname: str | None = None,
        node_netns: str | None = None,
    ) -> None:
        with self.lock:
            self.unwired.append((pod_ifname, pod_netns, host_ifname))
            if host_ifname:
                self.wired.pop(host_ifname, None)

    def check(self, spec: wiring.PodWiring, node_netns: str | None = None) -> list[str]:
        return list(self.problems)


@pytest.fixture
def kernel(monkeypatch: pytest.MonkeyPatch) -> FakeKernel:
    fake = FakeKernel()
    monkeypatch.setattr(wiring, "wire", fake.wire)
    monkeypatch.setattr(wiring, "unwire", fake.unwire)
    monkeypatch.setattr(wiring, "check", fake.check)
    return fake


class Recorder:
    def __init__(self) -> None:
        self.annotations: list[tuple[PodKey, dict[str, str]]] = []
        self.added: list[Endpoint] = []
        self.removed: list[Endpoint] = []

    def annotate(self, pod: PodKey, values: Mapping[str, str]) -> None:
        self.annotations.append((pod, dict(values)))


@pytest.fixture
def rec() -> Recorder:
    return Recorder()


@pytest.fixture
def handlers(kernel: FakeKernel, rec: Recorder) -> CNIHandlers:
    h = CNIHandlers(
        PoolAllocator("10.65.0.0/24"),
        annotate=rec.annotate,
        on_endpoint_added=rec.added.append,
        on_endpoint_removed=rec.removed.append,
    )
    h.set_synced()
    return h


def req(
    command: str = "ADD", cid: str = "c1", pod: str = "nginx", **config: object
) -> cni_server.CNIRequest:
    conf = {"cniVersion": "1.0.0", "name": NET, "type": "tabby", **config}
    if command in ("STATUS", "GC"):
        conf["cniVersion"] = "1.1.0"
    env = {
        "CNI_CONTAINERID": cid,
        "CNI_IFNAME": "eth0",
        "CNI_NETNS": "/proc/self/ns/net",
        "CNI_ARGS": f"K8S_POD_NAMESPACE=default;K8S_POD_NAME={pod};K8S_POD_UID=u-{pod}",
        "CNI_PATH": "/opt/cni/bin",
    }
    return parse_request({"command": command, "env": env, "config": conf})


def code_of(handlers: CNIHandlers, request: cni_server.CNIRequest) -> int:
    with pytest.raises(shim.CNIError) as err:
        handlers.handle(request)
    return err.value.code


def test_add_assigns_wires_annotates_and_registers(
    handlers: CNIHandlers, kernel: FakeKernel, rec: Recorder
) -> None:
    result = handlers.handle(req())
    assert result is not None
    assert result["cniVersion"] == "1.0.0"
    assert result["ips"] == [{"address": "10.65.0.2/32", "interface": 1}]
    assert result["interfaces"][0] == {"name": "calic440f455693", "mac": "ee:ee:ee:ee:ee:ee"}
    assert result["interfaces"][1]["sandbox"] == "/proc/self/ns/net"
    assert kernel.wired["calic440f455693"].address == ipaddress.IPv4Address("10.65.0.2")
    key, values = rec.annotations[0]
    assert (key.namespace, key.name, key.uid, key.container_id) == (
        "default",
        "nginx",
        "u-nginx",
        "c1",
    )
    assert values == {"tabby.dev/podIP": "10.65.0.2/32", "tabby.dev/containerID": "c1"}
    assert [e.handle_id for e in rec.added] == [f"{NET}.c1"]
    assert handlers.endpoints.get("c1", "eth0") is not None


def test_repeated_add_returns_the_same_result(handlers: CNIHandlers) -> None:
    assert handlers.handle(req()) == handlers.handle(req())
    assert handlers.allocator.handles() == {f"{NET}.c1"}


def test_add_uses_config_mtu(handlers: CNIHandlers, kernel: FakeKernel) -> None:
    handlers.handle(req(mtu=1400))
    assert kernel.wired["calic440f455693"].mtu == 1400


def test_add_without_k8s_args_names_veth_by_container(
    handlers: CNIHandlers, kernel: FakeKernel, rec: Recorder
) -> None:
    request = parse_request(
        {
            "command": "ADD",
            "env": {
                "CNI_CONTAINERID": "0123456789abcdef",
                "CNI_IFNAME": "eth0",
                "CNI_NETNS": "/proc/self/ns/net",
            },
            "config": {"cniVersion": "0.3.1", "name": NET, "type": "tabby"},
        }
    )
    result = handlers.handle(request)
    assert result is not None
    assert result["interfaces"][0]["name"] == "cali0123456789a"
    assert result["ips"][0]["version"] == "4"
    assert rec.annotations == []


def test_add_before_sync_is_try_again(kernel: FakeKernel, rec: Recorder) -> None:
    h = CNIHandlers(PoolAllocator("10.65.0.0/24"))
    assert code_of(h, req()) == shim.ERR_TRY_AGAIN_LATER
    assert h.allocator.handles() == set()


def test_status_follows_sync_and_pool(kernel: FakeKernel) -> None:
    h = CNIHandlers(PoolAllocator("10.65.0.0/30"))
    assert code_of(h, req("STATUS")) == shim.ERR_NOT_AVAILABLE
    h.set_synced()
    assert h.handle(req("STATUS")) is None
    h.handle(req("ADD", "c1", "a"))  # /30 has one usable address after the reserved one
    with pytest.raises(shim.CNIError) as err:
        h.handle(req("STATUS"))
    assert (err.value.code, "pool" in err.value.msg) == (shim.ERR_NOT_AVAILABLE, True)


def test_wiring_failure_rolls_back(
    handlers: CNIHandlers, kernel: FakeKernel, rec: Recorder
) -> None:
    kernel.fail_with = wiring.WiringError("eth0 already exists")
    assert code_of(handlers, req()) == shim.ERR_INTERNAL
    assert handlers.allocator.handles() == set()
    assert handlers.endpoints.all() == []
    assert kernel.unwired == [("eth0", None, "calic440f455693")]  # host end only


def test_missing_netns_during_wiring_is_code_3(handlers: CNIHandlers, kernel: FakeKernel) -> None:
    kernel.fail_with = wiring.NetnsMissing("gone")
    assert code_of(handlers, req()) == shim.ERR_UNKNOWN_CONTAINER


def test_annotation_failure_rolls_back(kernel: FakeKernel) -> None:
    def broken(_pod: PodKey, _values: Mapping[str, str]) -> None:
        raise ConnectionError("apiserver down")

    h = CNIHandlers(PoolAllocator("10.65.0.0/24"), annotate=broken)
    h.set_synced()
    assert code_of(h, req()) == shim.ERR_INTERNAL
    assert h.allocator.handles() == set()


def test_del_releases_and_repeats(handlers: CNIHandlers, kernel: FakeKernel, rec: Recorder) -> None:
    handlers.handle(req())
    assert handlers.handle(req("DEL")) is None
    assert handlers.handle(req("DEL")) is None
    assert handlers.allocator.handles() == set()
    # a known endpoint: answered first, its host end deleted by the deferred teardown
    assert kernel.unwired[0] == ("eth0", None, "calic440f455693")
    assert kernel.unwired[1] == ("eth0", "/proc/self/ns/net", None)  # unknown now: host untouched
    assert rec.annotations[-1][1] == {"tabby.dev/podIP": ""}
    assert [e.container_id for e in rec.removed] == ["c1"]


def test_stale_del_leaves_the_new_sandbox_veth(handlers: CNIHandlers, kernel: FakeKernel) -> None:
    handlers.handle(req("ADD", "old"))
    handlers.endpoints.remove("old", "eth0")  # the old sandbox's record is gone...
    handlers.handle(req("ADD", "new"))  # ...and the pod's new sandbox reuses the name
    handlers.handle(req("DEL", "old"))
    assert kernel.unwired[-1] == ("eth0", "/proc/self/ns/net", None)
    assert "calic440f455693" in kernel.wired
    assert handlers.allocator.handles() == {f"{NET}.new"}


def test_check_unknown_container_is_code_3(handlers: CNIHandlers) -> None:
    assert code_of(handlers, req("CHECK")) == shim.ERR_UNKNOWN_CONTAINER


def test_check_reports_problems(handlers: CNIHandlers, kernel: FakeKernel) -> None:
    prev = handlers.handle(req())
    assert handlers.handle(req("CHECK", prevResult=prev)) is None
    kernel.problems = ["host route 10.65.0.2/32 is missing"]
    with pytest.raises(shim.CNIError) as err:
        handlers.handle(req("CHECK", prevResult=prev))
    assert err.value.code == shim.ERR_CHECK_FAILED
    assert "host route" in err.value.details


def test_check_uses_prev_result_after_restart(handlers: CNIHandlers, kernel: FakeKernel) -> None:
    prev = handlers.handle(req())
    handlers.endpoints.remove("c1", "eth0")
    assert handlers.handle(req("CHECK", prevResult=prev)) is None


def test_check_detects_prev_result_mismatch(handlers: CNIHandlers) -> None:
    prev = handlers.handle(req())
    assert prev is not None
    prev["ips"][0]["address"] = "10.65.0.99/32"
    assert code_of(handlers, req("CHECK", prevResult=prev)) == shim.ERR_CHECK_FAILED


def test_gc_releases_unlisted_attachments(handlers: CNIHandlers, kernel: FakeKernel) -> None:
    for cid in ("keep", "drop1", "drop2"):
        handlers.handle(req("ADD", cid, pod=cid))
    handlers.allocator.assign("other-net.x", {})  # another network's handle is not ours
    attachments = [{"containerID": "keep", "ifname": "eth0"}]
    assert handlers.handle(req("GC", **{"cni.dev/attachments": attachments})) is None
    assert handlers.allocator.handles() == {f"{NET}.keep", "other-net.x"}
    assert [e.container_id for e in handlers.endpoints.all()] == ["keep"]


def test_keyed_locks_are_dropped_after_use() -> None:
    locks = cni_handlers.KeyedLocks()
    with locks.hold("a"), locks.hold("b"):
        assert len(locks._locks) == 2
    assert locks._locks == {}


# --- through the socket, with the real shim code ------------------------------------


@pytest.fixture
def server(handlers: CNIHandlers, tmp_path: Path) -> Iterator[CNIServer]:
    srv = CNIServer(str(tmp_path / "run" / "cni.sock"), handlers)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def shim_call(path: str, command: str, cid: str, pod: str, **config: object) -> tuple[int, str]:
    conf = {"cniVersion": "1.0.0", "name": NET, "type": "tabby", "agent_socket": path, **config}
    env = {
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": cid,
        "CNI_IFNAME": "eth0",
        "CNI_NETNS": "/proc/self/ns/net",
        "CNI_ARGS": f"K8S_POD_NAMESPACE=default;K8S_POD_NAME={pod}",
    }
    return shim.run(env, json.dumps(conf).encode())


def test_socket_is_root_only(server: CNIServer) -> None:
    assert stat.S_IMODE(os.stat(server.path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(server.path)).st_mode) == 0o700


def test_second_server_on_a_live_socket_refuses(server: CNIServer, handlers: CNIHandlers) -> None:
    with pytest.raises(RuntimeError, match="already serving"):
        CNIServer(server.path, handlers)


def test_shim_round_trip(server: CNIServer) -> None:
    rc, out = shim_call(server.path, "ADD", "c1", "nginx")
    assert rc == 0
    assert json.loads(out)["ips"][0]["address"] == "10.65.0.2/32"
    assert shim_call(server.path, "DEL", "c1", "nginx") == (0, "")


def test_agent_error_reaches_the_runtime(server: CNIServer) -> None:
    rc, out = shim_call(server.path, "CHECK", "nope", "nginx")
    assert rc == 1
    assert json.loads(out)["code"] == shim.ERR_UNKNOWN_CONTAINER


def test_garbage_on_the_socket_is_a_decoding_error(server: CNIServer) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(server.path)
    sock.sendall(b"\x00garbage")
    sock.shutdown(socket.SHUT_WR)
    reply = json.loads(sock.recv(65536))
    sock.close()
    assert reply["error"]["code"] == shim.ERR_DECODING


def test_fifty_parallel_adds_get_unique_addresses(server: CNIServer) -> None:
    with ThreadPoolExecutor(max_workers=50) as pool:
        outs = list(pool.map(lambda i: shim_call(server.path, "ADD", f"c{i}", f"p{i}"), range(50)))
    assert all(rc == 0 for rc, _ in outs), outs
    addresses = {json.loads(out)["ips"][0]["address"] for _, out in outs}
    assert len(addresses) == 50


def test_startup_gc_frees_addresses_whose_del_missed_the_agent(
    handlers: CNIHandlers, kernel: FakeKernel
) -> None:
    handlers.handle(req("ADD", "alive", pod="a"))
    handlers.handle(req("ADD", "gone", pod="b"))  # its DEL found the agent down
    assert handlers.collect_garbage(NET, {"alive"}) == []
    assert handlers.allocator.handles() == {f"{NET}.alive"}
    assert kernel.unwired == [("eth0", "/proc/self/ns/net", wiring.host_ifname_for("default", "b"))]


def test_endpoint_hook_failure_fails_add_and_rolls_back(kernel: FakeKernel) -> None:
    def policy_not_programmed(_ep: Endpoint) -> None:
        raise TimeoutError("policy not programmed in time")

    h = CNIHandlers(PoolAllocator("10.65.0.0/24"), on_endpoint_added=policy_not_programmed)
    h.set_synced()
    with pytest.raises(shim.CNIError) as err:
        h.handle(req())
    assert (err.value.code, err.value.details) == (
        shim.ERR_INTERNAL,
        "policy not programmed in time",
    )
    assert h.endpoints.all() == []
    assert h.allocator.handles() == set()


def test_late_del_of_old_sandbox_with_record_keeps_new_veth(
    handlers: CNIHandlers, kernel: FakeKernel
) -> None:
    handlers.handle(req("ADD", "old"))
    handlers.handle(req("ADD", "new"))  # same pod, new sandbox: same host veth name
    handlers.handle(req("DEL", "old"))
    assert kernel.unwired[-1] == ("eth0", "/proc/self/ns/net", None)
    assert "calic440f455693" in kernel.wired
    handlers.handle(req("DEL", "new"))
    assert handlers.teardowns.drain()
    assert kernel.unwired[-1] == ("eth0", None, "calic440f455693")


def test_assign_gets_handle_and_pod_attributes(kernel: FakeKernel) -> None:
    seen: list[tuple[str, dict[str, str]]] = []

    class Recording(PoolAllocator):
        def assign(self, handle_id: str, attrs: Mapping[str, str]) -> ipaddress.IPv4Address:
            seen.append((handle_id, dict(attrs)))
            return super().assign(handle_id, attrs)

    h = CNIHandlers(Recording("10.65.0.0/24"))
    h.set_synced()
    h.handle(req())
    assert seen == [
        (
            f"{NET}.c1",
            {"ifname": "eth0", "namespace": "default", "pod": "nginx", "uid": "u-nginx"},
        )
    ]


def test_add_reports_the_time_of_each_step(kernel: FakeKernel, rec: Recorder) -> None:
    """Where an ADD's time goes: assign, wire, program, then what was left to wait for
    the annotation (it runs beside the programming), each reported once."""
    seen: list[dict[str, float]] = []
    h = CNIHandlers(
        PoolAllocator("10.65.0.0/24"),
        annotate=rec.annotate,
        on_endpoint_added=rec.added.append,
        observe_add_phases=lambda phases: seen.append(dict(phases)),
    )
    h.set_synced()
    h.handle(req())
    assert len(seen) == 1
    assert list(seen[0]) == ["assign", "wire", "program", "annotate"]
    assert all(seconds >= 0 for seconds in seen[0].values())


def test_a_failed_add_reports_no_steps(kernel: FakeKernel, rec: Recorder) -> None:
    seen: list[dict[str, float]] = []
    kernel.fail_with = wiring.WiringError("no veth today")
    h = CNIHandlers(
        PoolAllocator("10.65.0.0/24"), observe_add_phases=lambda p: seen.append(dict(p))
    )
    h.set_synced()
    with pytest.raises(shim.CNIError):
        h.handle(req())
    assert seen == []


def test_phase_clock_gives_each_lap_its_own_time(monkeypatch: pytest.MonkeyPatch) -> None:
    ticks = iter([10.0, 10.25, 11.0])
    monkeypatch.setattr(cni_handlers.time, "perf_counter", lambda: next(ticks))
    clock = cni_server.PhaseClock()
    clock.lap("assign")
    clock.lap("wire")
    assert clock.seconds == {"assign": 0.25, "wire": 0.75}
    assert clock.summary() == "assign 250, wire 750"


def test_the_annotation_is_written_while_the_policy_is_programmed(kernel: FakeKernel) -> None:
    """The two waits of an ADD overlap: the annotation does not wait for the program
    step, and the ADD answers only when both are done."""
    programming = threading.Event()
    annotated: list[dict[str, str]] = []

    def annotate(_pod: PodKey, values: Mapping[str, str]) -> None:
        assert programming.wait(30), "the annotation waited for the program step"
        annotated.append(dict(values))

    def program(_ep: Endpoint) -> None:
        programming.set()

    h = CNIHandlers(PoolAllocator("10.65.0.0/24"), annotate=annotate, on_endpoint_added=program)
    h.set_synced()
    assert h.handle(req()) is not None
    assert annotated == [{"tabby.dev/podIP": "10.65.0.2/32", "tabby.dev/containerID": "c1"}]


def test_a_failed_program_step_waits_for_the_annotation_then_rolls_back(
    kernel: FakeKernel,
) -> None:
    finished: list[str] = []
    removed: list[Endpoint] = []

    def annotate(_pod: PodKey, _values: Mapping[str, str]) -> None:
        finished.append("annotation")

    def program(_ep: Endpoint) -> None:
        raise RuntimeError("iptables-restore failed")

    h = CNIHandlers(
        PoolAllocator("10.65.0.0/24"),
        annotate=annotate,
        on_endpoint_added=program,
        on_endpoint_removed=removed.append,
    )
    h.set_synced()
    assert code_of(h, req()) == shim.ERR_INTERNAL
    assert finished == ["annotation"]
    assert h.endpoints.all() == [] and h.allocator.handles() == set()
    assert [e.container_id for e in removed] == ["c1"]  # its chains go with the next pass
