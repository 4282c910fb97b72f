"""A failing best-effort pass (BGP, tunnels) retries with backoff, not at once (issue 21, item 4).

Before, `_best_effort` asked the loop for a retry immediately: a pass failing on the
same input reran ~100 times a second, each with a traceback in the log.
"""

from __future__ import annotations

import logging
import time

import pytest

from datastore.client import Datastore
from datastore.memory import MemoryTransport
from felix.agent import Agent, AgentConfig


def test_a_pass_that_keeps_failing_backs_off_and_logs_its_traceback_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    agent = Agent(AgentConfig(node_name="n1", kubeconfig="unused"), Datastore(MemoryTransport()))

    def broken() -> None:
        raise ValueError("the same bad input")

    caplog.set_level(logging.INFO, logger="felix.agent")
    delays = []
    for _ in range(8):
        began = time.monotonic()
        agent._best_effort(broken, "bgp")
        assert not agent.loop._reasons  # nothing asked for at once
        delays.append(round(agent.loop._later.pop("retry-bgp") - began, 1))
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert sum(r.exc_info is not None for r in caplog.records) == 1
    assert agent.readiness.report()["bgp-programmed"]["ok"] is False
    agent._best_effort(lambda: None, "bgp")  # recovered: the next failure starts over
    assert agent.readiness.report()["bgp-programmed"]["ok"] is True
    agent._best_effort(broken, "bgp")
    assert agent.loop._later["retry-bgp"] - time.monotonic() <= 0.5
