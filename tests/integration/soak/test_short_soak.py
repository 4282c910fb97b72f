"""`make soak` in short: a fixed seed for a minute and until every fault kind came once.

The same runner as the 15-minute soak (``tests/soak/runner.py``) on the same lab:
three nodes with real agents and ExaBGP, the truth table's pods and oracle, churn
bursts, an established TCP flow. The seed is fixed so that a failure here is the
same failure on every machine, and ``python -m tests.soak.runner --seed`` replays it.
"""

from __future__ import annotations

from pathlib import Path

from tests.soak.runner import run_soak, summary
from tests.soak.schedule import FAULT_KINDS

SEED = 20261207
MINUTES = 1.0  # this seed meets its last fault kind at about 76 s
APISERVER_DOWN_S = 15.0  # the full soak's is 60 s; here the restart is what matters


def test_a_short_seeded_soak_loses_nothing_and_lets_nobody_in(tmp_path: Path) -> None:
    tally = run_soak(MINUTES, SEED, tmp_path / "lab", apiserver_down_s=APISERVER_DOWN_S)
    report = "\n".join([*summary(tally), tally.last_line()])
    print(report)  # -s shows the run; a failure shows it in the assertion
    assert set(tally.fault_kinds) == set(FAULT_KINDS), report
    assert tally.minutes >= MINUTES, report
    assert tally.pods > 0 and tally.policies > 0 and tally.checks > tally.events, report
    assert tally.flow_exchanges > 100, report  # the flow ran all through (5 echoes a second)
    assert tally.clean, report
    assert tally.add_failures == [] and tally.fault_misses == [], report
