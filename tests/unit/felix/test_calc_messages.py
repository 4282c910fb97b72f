"""Typed dataplane messages (felix.calc.messages): nothing is lost between two states,
and a dataplane written by messages holds exactly what one written whole holds.

Random sequences of pod, namespace, policy and endpoint changes (the strategies of
test_calc_policy) go into a PolicyCalculator; after each change the messages from the
previous answer to the new one must rebuild the new answer, and two fake kernels, one
written whole every time and one written by messages, must hold the same filter
table and ipsets.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from felix.calc import ChainRemove, ChainUpdate, IPSetRemove, PolicyCalculator, changes, fold
from felix.policy_dataplane import PolicyDataplane
from policy import DesiredState
from tests.unit.dataplane.fake_kernel import FakeKernel
from tests.unit.felix.test_calc_policy import (
    CHANGES,
    IFACES,
    POD_KEYS,
    Everything,
    namespace_change,
    pod_change,
    policy_change,
)


@st.composite
def busy(draw: st.DrawFn) -> list[tuple[str, Any]]:
    """A node with namespaces, pods, every interface wired and some policies, then
    random changes and the policies' deletions: the messages then carry chain and set
    updates and removals."""
    start = [draw(namespace_change()) for _ in range(3)]
    start += [draw(pod_change()) for _ in range(8)]
    start += [("endpoint", (iface, draw(st.sampled_from(POD_KEYS)))) for iface in IFACES]
    made = [draw(policy_change()) for _ in range(4)]
    # the policies go away again at random moments: their chains and sets are removed
    gone = [("policy", (key, None)) for _, (key, _) in made]
    tail = draw(st.permutations(draw(st.lists(CHANGES, min_size=1, max_size=30)) + gone))
    return start + made + tail


def _same(a: DesiredState, b: DesiredState) -> bool:
    return (dict(a.chains), dict(a.ipsets), dict(a.members)) == (
        dict(b.chains),
        dict(b.ipsets),
        dict(b.members),
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(busy())
def test_the_messages_between_two_answers_rebuild_the_second(
    sequence: list[tuple[str, Any]],
) -> None:
    calc, world = PolicyCalculator(), Everything()
    previous = calc.desired()
    for change in sequence:
        world.apply(calc, change)
        current = calc.desired()
        messages = changes(previous, current)
        assert _same(fold(previous, messages), current)
        for message in messages:  # removals name only what is gone
            if isinstance(message, ChainRemove):
                assert message.name not in current.chains
            if isinstance(message, IPSetRemove):
                assert message.name not in current.ipsets
        previous = current
    assert changes(previous, calc.desired()) == []  # nothing changed: nothing to write


def test_an_untouched_answer_gives_no_message_and_a_new_endpoint_only_its_own() -> None:
    calc, world = PolicyCalculator(), Everything()
    for change in (
        ("namespace", ("ns0", None)),
        ("endpoint", ("cali0", ("ns0", "pod0"))),
    ):
        world.apply(calc, change)
    before = calc.desired()
    assert changes(before, calc.desired()) == []
    world.apply(calc, ("endpoint", ("cali1", ("ns0", "pod1"))))
    after = calc.desired()
    updated = {m.chain.name for m in changes(before, after) if isinstance(m, ChainUpdate)}
    assert updated == set(after.chains) - set(before.chains)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(busy())
def test_a_dataplane_written_by_messages_holds_what_one_written_whole_holds(
    sequence: list[tuple[str, Any]],
) -> None:
    whole_kernel, by_messages_kernel = FakeKernel(), FakeKernel()
    whole = PolicyDataplane(whole_kernel, "nft")
    by_messages = PolicyDataplane(by_messages_kernel, "nft")
    calc, world = PolicyCalculator(), Everything()
    previous = calc.desired()
    by_messages.apply_state(previous, calc.local_pods())
    for change in sequence:
        world.apply(calc, change)
        current, local = calc.desired(), calc.local_pods()
        whole.apply_state(current, local)
        by_messages.apply_changes(changes(previous, current), local)
        previous = current
        assert (
            by_messages_kernel.iptables["nft"]["filter"] == whole_kernel.iptables["nft"]["filter"]
        )
        assert by_messages_kernel.ipsets == whole_kernel.ipsets
