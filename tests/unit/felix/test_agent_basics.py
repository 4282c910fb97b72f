"""The agent's plumbing: readiness, health/metrics endpoints, JSON logs, the reconcile loop."""

from __future__ import annotations

import gc
import json
import logging
import os
import signal
import stat
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter

from datastore.client import Datastore
from datastore.memory import MemoryTransport
from felix.agent import Agent, AgentConfig, prepare_run_dir
from felix.health import HealthServer, Readiness
from felix.logs import JsonFormatter
from felix.loop import ReconcileLoop


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_readyz_names_the_missing_condition_and_metrics_are_served() -> None:
    readiness = Readiness("datastore", "dataplane")
    registry = CollectorRegistry()
    Counter("tabby_test_total", "a test counter", registry=registry).inc(3)
    server = HealthServer(readiness, registry, port=0).start()
    try:
        assert _get(server.port, "/healthz") == (200, "ok\n")
        code, body = _get(server.port, "/readyz")
        assert code == 503 and json.loads(body)["datastore"]["ok"] is False
        readiness.set("datastore", True)
        readiness.set("dataplane", False, "iptables-restore failed")
        code, body = _get(server.port, "/readyz")
        assert code == 503 and json.loads(body)["dataplane"]["reason"] == "iptables-restore failed"
        readiness.set("dataplane", True)
        assert _get(server.port, "/readyz")[0] == 200
        readiness.shutting_down = True
        assert _get(server.port, "/readyz")[0] == 503
        code, body = _get(server.port, "/metrics")
        assert code == 200 and "tabby_test_total 3.0" in body
        assert _get(server.port, "/nope")[0] == 404
    finally:
        server.stop()


def test_json_logs_carry_extra_fields() -> None:
    record = logging.LogRecord("tabby.x", logging.INFO, __file__, 1, "pod %s wired", ("a",), None)
    record.pod = "ns/a"
    entry = json.loads(JsonFormatter().format(record))
    assert entry["msg"] == "pod a wired" and entry["pod"] == "ns/a" and entry["level"] == "info"


def test_reconcile_loop_coalesces_requests_and_survives_failures() -> None:
    seen: list[set[str]] = []
    gate = threading.Event()
    fail_once = {"armed": True}

    def sync(reasons: set[str]) -> None:
        gate.wait(5)
        seen.append(reasons)
        if fail_once["armed"] and "boom" in reasons:
            fail_once["armed"] = False
            raise RuntimeError("transient")

    loop = ReconcileLoop(sync, resync_interval_s=3600).start()
    try:
        loop.request("a")
        time.sleep(0.1)  # the loop is now blocked inside sync({"a"})
        for reason in ("b", "c", "boom"):
            loop.request(reason)
        gate.set()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not any("retry" in s for s in seen):
            time.sleep(0.02)
        assert seen[0] == {"a"}
        assert seen[1] == {"b", "c", "boom"}  # three requests, one pass
        assert any("retry" in s for s in seen[2:])  # a failed pass is retried
        assert loop.failures == 1 and loop.alive()
    finally:
        loop.stop()


def test_run_freezes_the_heap_start_up_built(monkeypatch: pytest.MonkeyPatch) -> None:
    """After start-up the collector must not walk the loaded libraries again."""
    agent = Agent(AgentConfig(node_name="n1", kubeconfig="unused"), Datastore(MemoryTransport()))
    started: list[int] = []
    monkeypatch.setattr(
        agent, "start", lambda: (started.append(gc.get_freeze_count()), agent.stopping.set())
    )
    monkeypatch.setattr(agent, "stop", lambda: None)
    handlers = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    gc.unfreeze()
    try:
        assert agent.run() == 0
        assert started == [0]  # nothing frozen before start-up ran
        assert gc.get_freeze_count() > 1000
    finally:
        gc.unfreeze()
        signal.signal(signal.SIGTERM, handlers[0])
        signal.signal(signal.SIGINT, handlers[1])


@pytest.mark.parametrize("existing", [None, 0o755, 0o777])
def test_the_run_dir_is_root_only_even_where_it_existed(
    tmp_path: Path, existing: int | None
) -> None:
    """kubelet's hostPath (DirectoryOrCreate) makes /run/tabby 0755 before the agent runs."""
    run_dir = tmp_path / "run" / "tabby"
    if existing is not None:
        run_dir.mkdir(parents=True)
        os.chmod(run_dir, existing)
    prepare_run_dir(run_dir)
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
