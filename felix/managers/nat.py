"""natOutgoing as a dataplane manager of its own, for a node whose NetworkPolicy
another engine enforces ($TABBY_POLICY=off).

natOutgoing is not policy: it is how pods of a pool reach what is outside every pool
(the control plane, the internet) when the network there has no route back to pod
addresses. With Tabby's policy on, :class:`~felix.policy_dataplane.PolicyDataplane`
writes it beside the filter table, through the one ipset manager that owns every
``cali40`` set. With policy off nothing else owns those sets, so this manager writes
the nat chains and the two pool sets alone, and never touches the filter table.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Set

from felix.dataplane import apply_in_order
from felix.dataplane.backend import detect_backend
from felix.dataplane.ipsets import IpsetManager
from felix.dataplane.iptables import Table
from felix.dataplane.runner import CommandRunner
from felix.nat_outgoing import PoolNat, nat_state


class NatOutgoingDataplane:
    """Writes :func:`~felix.nat_outgoing.nat_state`: the nat table's Tabby chains, the
    POSTROUTING hook and the pool sets; only what differs reaches the kernel."""

    def __init__(self, runner: CommandRunner, backend: str = "auto") -> None:
        self.backend = detect_backend(runner, backend)
        self.nat = Table("nat", runner, self.backend)
        self.ipsets = IpsetManager(runner)

    def apply(self, pools: Iterable[PoolNat], *, resync: bool = False) -> None:
        nat = nat_state(pools)
        if resync:
            self.nat.invalidate()
            self.ipsets.invalidate()
        self.ipsets.replace_sets(nat.ipsets)
        self.nat.replace_chains(nat.chains)
        for kernel_chain, rules in nat.hooks.items():
            self.nat.append_hooks(kernel_chain, rules)
        apply_in_order(self.ipsets, [self.nat])


class NatOutgoingManager:
    """Keeps natOutgoing as the pools say: written when they change, repaired on
    resync (a flushed chain, a destroyed set)."""

    name = "nat-outgoing"

    def __init__(
        self, dataplane: NatOutgoingDataplane, pools: Callable[[], Iterable[PoolNat]]
    ) -> None:
        self.dataplane = dataplane
        self.pools = pools
        self._written: list[PoolNat] | None = None

    def on_update(self, reasons: Set[str]) -> None:
        del reasons  # apply compares the pools themselves: cheap, and never stale

    def apply(self) -> None:
        pools = self._desired()
        if pools != self._written:
            self.dataplane.apply(pools)
            self._written = pools

    def resync(self) -> None:
        self._written = None
        pools = self._desired()
        self.dataplane.apply(pools, resync=True)
        self._written = pools

    def _desired(self) -> list[PoolNat]:
        """The pools in a fixed order, so an unchanged set compares equal."""
        return sorted(self.pools(), key=lambda p: (p.cidr, p.nat_outgoing))
