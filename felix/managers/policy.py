"""NetworkPolicy as a dataplane manager: the filter table's chains and the ipsets."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Set
from dataclasses import dataclass
from typing import Any

from felix.calc.messages import changes
from felix.nat_outgoing import PoolNat
from felix.policy_dataplane import PolicyDataplane
from felix.policy_sync import Cache, PolicySync, WiredEndpoint
from policy import DesiredState
from policy import Pod as PolicyPod
from policy.membership import AddressBook
from policy.realization import Version


@dataclass(frozen=True)
class PolicySources:
    """Where a policy pass reads its inputs (the agent's caches and endpoint table)."""

    caches: Mapping[str, Cache]  # the informers: pods, namespaces, policies
    local_endpoints: Callable[[], Mapping[str, WiredEndpoint]]
    address_book: Callable[[], AddressBook]  # who IPAM says holds each address
    fetch_pod: Callable[[str, str], dict[str, Any] | None]  # a Pod the cache lacks yet
    pools: Callable[[], Iterable[PoolNat]]  # natOutgoing of each pool
    hosts: Callable[[], Iterable[str]] = tuple  # every node address: the BGP guard's set


class PolicyManager:
    """Recomputes what changed (:class:`felix.policy_sync.PolicySync`, which the
    informers tell which objects changed) and writes only the difference: the typed
    messages (:mod:`felix.calc.messages`: chain and set updates, explicit removals)
    between the state last written and the new one
    (:meth:`felix.policy_dataplane.PolicyDataplane.apply_changes`).

    ``resync`` starts the calculation afresh from the whole caches and re-reads the
    kernel's tables first, so a missed event or a hand-edited chain lasts one resync
    period at most. A failure propagates: an ADD must not succeed unprotected.
    """

    name = "policy"

    def __init__(
        self,
        calculation: PolicySync,
        dataplane: PolicyDataplane,
        sources: PolicySources,
        on_programmed: Callable[[dict[str, Version], frozenset[str]], None] | None = None,
    ) -> None:
        self.calculation = calculation
        self.dataplane = dataplane
        self.sources = sources
        # Told the policy versions a written pass programmed (the node's report), when
        # they may differ from the last ones told.
        self.on_programmed = on_programmed
        self._told: tuple[int, int, int] | None = None
        # The state the dataplane was last given whole or brought to by messages: the
        # next apply writes only the messages from it (None: write the whole state).
        self._written: DesiredState | None = None

    def on_update(self, reasons: Set[str]) -> None:
        del reasons  # the informers note each changed object in the calculation's keys

    def apply(self) -> None:
        """Write the typed messages between the last state written and this one."""
        desired, local = self._compute(afresh=False)
        if self._written is None:
            self.dataplane.apply_state(
                desired, local, pools=self.sources.pools(), hosts=self.sources.hosts()
            )
        else:
            messages = changes(self._written, desired)
            self.dataplane.apply_changes(
                messages, local, pools=self.sources.pools(), hosts=self.sources.hosts()
            )
        self._written = desired
        self._programmed()

    def resync(self) -> None:
        """Recompute from the whole caches and write the whole state, the kernel re-read."""
        self._written = None  # until the whole state is written, no message is relative
        desired, local = self._compute(afresh=True)
        self.dataplane.apply_state(
            desired, local, pools=self.sources.pools(), hosts=self.sources.hosts(), resync=True
        )
        self._written = desired
        self._programmed()

    def _programmed(self) -> None:
        if self.on_programmed is None:
            return
        revision = self.calculation.programmed_revision()
        if revision != self._told:
            self.on_programmed(*self.calculation.programmed())
            self._told = revision

    def _compute(self, afresh: bool) -> tuple[DesiredState, Mapping[str, PolicyPod]]:
        sources = self.sources
        return self.calculation.compute(
            sources.caches,
            sources.local_endpoints(),
            sources.address_book,
            sources.fetch_pod,
            afresh=afresh,
        )
