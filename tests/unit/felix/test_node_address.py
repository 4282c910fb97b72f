"""The agent publishes its BGP address on its Node; a missing Node is logged once."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from bgp.annotations import IPV4_ADDRESS
from datastore.client import Datastore
from datastore.memory import MemoryTransport
from felix.agent import Agent, AgentConfig


def test_a_missing_node_warns_once_per_absence(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    agent = Agent(
        AgentConfig(node_name="n1", kubeconfig="unused", node_ip="172.31.0.11/24"),
        Datastore(MemoryTransport()),
    )
    nodes: list[dict[str, Any]] = []
    annotated: list[dict[str, str]] = []
    monkeypatch.setattr(agent, "_objects", lambda informer: list(nodes))
    monkeypatch.setattr(agent, "_annotate_node", annotated.append)
    caplog.set_level(logging.INFO, logger="felix.agent")

    def warnings() -> int:
        return sum("does not exist" in r.getMessage() for r in caplog.records)

    for _ in range(3):
        agent._publish_node_address()
    assert warnings() == 1 and annotated == []
    nodes.append({"metadata": {"name": "n1"}})
    agent._publish_node_address()
    assert annotated == [{IPV4_ADDRESS: "172.31.0.11/24"}]
    assert any("exists again" in r.getMessage() for r in caplog.records)
    nodes.clear()
    agent._publish_node_address()
    agent._publish_node_address()
    assert warnings() == 2
