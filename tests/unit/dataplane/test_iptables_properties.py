"""Property: whatever the sequence of desired states and drift, apply() converges.

After every apply, the fake kernel holds exactly the desired owned chains, the
hook rules sit at the top/bottom of their kernel chain, and every foreign rule
is still there in its original relative order.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from felix.dataplane.backend import NFT
from felix.dataplane.iptables import Rule, Table
from tests.unit.dataplane.fake_kernel import FakeKernel

CHAINS = ["cali-a", "cali-b", "cali-c"]
RULES = [Rule(("-s", f"10.0.0.{n}", "-j", "ACCEPT")) for n in range(4)] + [Rule(("-j", "DROP"))]

rules_st = st.lists(st.sampled_from(RULES), max_size=6)


@dataclass
class Step:
    chains: dict[str, list[Rule]]
    inserted: list[Rule]
    appended: list[Rule]
    foreign_at: int | None  # insert a foreign rule into FORWARD at this index
    delete_owned: bool  # delete the first rule of the first owned chain behind our back


step_st = st.builds(
    Step,
    chains=st.dictionaries(st.sampled_from(CHAINS), rules_st, max_size=3),
    inserted=st.lists(st.sampled_from(RULES), max_size=2),
    appended=st.lists(st.sampled_from(RULES), max_size=2),
    foreign_at=st.none() | st.integers(min_value=0, max_value=6),
    delete_owned=st.booleans(),
)


def _drift(kernel: FakeKernel, step: Step, serial: int) -> list[str]:
    """Change the kernel behind Tabby's back; return FORWARD's foreign rules, in order."""
    filt = kernel.iptables["nft"]["filter"]
    forward = filt["FORWARD"]
    if step.foreign_at is not None:
        forward.insert(min(step.foreign_at, len(forward)), f"-s 192.0.2.{serial} -j DROP")
    owned = sorted(c for c in filt if c.startswith("cali-") and filt[c])
    if step.delete_owned and owned:
        del filt[owned[0]][0]
    return [rule for rule in forward if "tby:" not in rule]


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(step_st, min_size=1, max_size=5))
def test_any_sequence_of_states_and_drift_converges(steps: list[Step]) -> None:
    kernel = FakeKernel()
    table = Table("filter", kernel, NFT, refresh_interval=None)
    for serial, step in enumerate(steps):
        for chain in set(CHAINS) - set(step.chains):
            table.remove_chain(chain)
        for chain, rules in step.chains.items():
            table.set_chain(chain, rules)
        table.insert_hooks("FORWARD", step.inserted)
        table.append_hooks("FORWARD", step.appended)

        table.apply()
        foreign = _drift(kernel, step, serial)
        table.invalidate()
        table.apply()

        filt = kernel.iptables["nft"]["filter"]
        assert {c for c in filt if c.startswith("cali-")} == set(step.chains)
        for chain, rules in step.chains.items():
            assert kernel.rules("nft", "filter", chain) == [r.render() for r in rules]
        expected = [r.render() for r in step.inserted] + foreign
        expected += [r.render() for r in step.appended]
        assert kernel.rules("nft", "filter", "FORWARD") == expected
        table.invalidate()
        assert table.apply().bytes_written == 0
