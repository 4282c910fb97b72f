"""Packet-filter dataplane: desired-state iptables tables and ipsets.

The node agent renders what it wants into :class:`Table` (one per iptables
table) and :class:`IpsetManager`, then calls :func:`apply_in_order`, which
writes in the only order that never leaves a rule pointing at a missing set:
ipset creates/updates, then iptables, then ipset deletions.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from felix.dataplane.backend import LEGACY, LEGACY_IPTC, NFT, Backend, detect_backend
from felix.dataplane.ipsets import IpsetApplyResult, IpsetError, IpsetManager
from felix.dataplane.iptables import ApplyResult, IptablesError, Rule, Table
from felix.dataplane.runner import CommandResult, CommandRunner, SubprocessRunner

__all__ = [
    "LEGACY",
    "LEGACY_IPTC",
    "NFT",
    "ApplyResult",
    "Backend",
    "CommandResult",
    "CommandRunner",
    "DataplaneApplyResult",
    "IpsetApplyResult",
    "IpsetError",
    "IpsetManager",
    "IptablesError",
    "Rule",
    "SubprocessRunner",
    "Table",
    "apply_in_order",
    "detect_backend",
]


@dataclass(frozen=True)
class DataplaneApplyResult:
    """Per-phase results of one :func:`apply_in_order` call."""

    ipset_updates: IpsetApplyResult
    tables: dict[str, ApplyResult]
    ipset_deletions: IpsetApplyResult

    @property
    def bytes_written(self) -> int:
        tables = sum(r.bytes_written for r in self.tables.values())
        return self.ipset_updates.bytes_written + tables


def apply_in_order(ipsets: IpsetManager, tables: Iterable[Table]) -> DataplaneApplyResult:
    """Sets the rules will need, then the rules, then sets no rule needs any more."""
    updates = ipsets.apply_updates()
    results = {table.name: table.apply() for table in tables}
    deletions = ipsets.apply_deletions()
    return DataplaneApplyResult(updates, results, deletions)
