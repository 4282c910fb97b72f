"""NetworkPolicy as a dataplane manager: the filter table's chains and the ipsets."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Set
from dataclasses import dataclass
from typing import Any

from felix.nat_outgoing import PoolNat
from felix.policy_dataplane import PolicyDataplane
from felix.policy_sync import Cache, PolicySync, WiredEndpoint
from policy.membership import AddressBook


@dataclass(frozen=True)
class PolicySources:
    """Where a policy pass reads its inputs (the agent's caches and endpoint table)."""

    caches: Mapping[str, Cache]  # the informers: pods, namespaces, policies
    local_endpoints: Callable[[], Mapping[str, WiredEndpoint]]
    address_book: Callable[[], AddressBook]  # who IPAM says holds each address
    fetch_pod: Callable[[str, str], dict[str, Any] | None]  # a Pod the cache lacks yet
    pools: Callable[[], Iterable[PoolNat]]  # natOutgoing of each pool


class PolicyManager:
    """Recomputes what changed (:class:`felix.policy_sync.PolicySync`, which the
    informers tell which objects changed) and writes only the difference
    (:class:`felix.policy_dataplane.PolicyDataplane`).

    ``resync`` starts the calculation afresh from the whole caches and re-reads the
    kernel's tables first, so a missed event or a hand-edited chain lasts one resync
    period at most. A failure propagates: an ADD must not succeed unprotected.
    """

    name = "policy"

    def __init__(
        self, calculation: PolicySync, dataplane: PolicyDataplane, sources: PolicySources
    ) -> None:
        self.calculation = calculation
        self.dataplane = dataplane
        self.sources = sources

    def on_update(self, reasons: Set[str]) -> None:
        del reasons  # the informers note each changed object in the calculation's keys

    def apply(self) -> None:
        self._pass(afresh=False)

    def resync(self) -> None:
        self._pass(afresh=True)

    def _pass(self, afresh: bool) -> None:
        sources = self.sources
        desired, local = self.calculation.compute(
            sources.caches,
            sources.local_endpoints(),
            sources.address_book,
            sources.fetch_pod,
            afresh=afresh,
        )
        self.dataplane.apply_state(desired, local, pools=sources.pools(), resync=afresh)
