"""The truth-table machinery of tests/bench/policy_truth_table.py, reduced: a few cases.

Same lab, pods, servers (TCP, UDP, raw-socket SCTP), emulated Services and oracle
as the bench; one backend per test. The bench runs every case on both.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from lab import netns
from tests.truthtable.cases import CASES, QUICK
from tests.truthtable.harness import BACKENDS, TruthLab
from tests.truthtable.runner import run_cases


@pytest.fixture(params=["nft", "legacy"])
def truth_lab(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TruthLab]:
    lab = TruthLab.up(tmp_path / "lab", request.param)
    try:
        yield lab
    finally:
        lab.down()


def test_quick_cases_match_the_oracle_on_real_packets(truth_lab: TruthLab) -> None:
    lines: list[str] = []
    result = run_cases(truth_lab, [c for c in CASES if c.name in QUICK], lines.append)
    assert result.cases == len(QUICK)
    assert result.mismatches == [], "\n".join(lines)
    assert 0 < result.allowed < result.cells, "some cells must be open and some closed"
    assert 0 < result.same_node < result.cells, "both same-node and cross-node pairs"
    assert result.refused == 0, "every served port answered (no REFUSED)"

    # The agents program natOutgoing too: the lab's pool does not ask for it, so the
    # chain exists without a MASQUERADE rule, beside kube-proxy's DNAT.
    save = f"{BACKENDS[truth_lab.backend][1]}-save"
    for node in truth_lab.cluster.nodes:
        nat = netns.ns_exec(node.netns, [save, "-t", "nat"])
        assert ":cali-nat-outgoing" in nat and "-j cali-POSTROUTING" in nat
        assert "MASQUERADE" not in nat and "-j KUBE-SERVICES" in nat

    # The harness is not vacuous: a policy the oracle is not told about is noticed
    # (from the open state: the last case may leave everything closed).
    truth_lab.reset()
    truth_lab.cluster.apply_policy(
        {"metadata": {"name": "unseen", "namespace": "z"}, "spec": {"podSelector": {}}}
    )
    unseen = truth_lab.check(converge_s=3.0)
    assert unseen.mismatches
    assert all(">z/" in m and "expected open" in m for m in unseen.mismatches)
