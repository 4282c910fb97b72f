"""iptables backends (nft and legacy) and how to choose one, as kube-proxy does.

Both backends speak the same restore/save text format, so a backend is just
the commands to run. The choice must match what kubelet and kube-proxy use on
the node: rules written through the other backend would live in a different
kernel subsystem and packets would see both, in an order nobody chose.

Detection (Calico's ``IptablesBackend=auto`` and the iptables-wrapper logic):

1. the backend whose ``mangle`` table holds kubelet's hint chains
   (``KUBE-IPTABLES-HINT``, ``KUBE-KUBELET-CANARY``) wins, nft first;
2. otherwise the backend with more rules wins, ties go to nft (the default on
   every current distribution).
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from felix.dataplane.runner import CommandRunner

log = logging.getLogger(__name__)

BackendName = Literal["nft", "legacy"]
HINT_CHAINS = ("KUBE-IPTABLES-HINT", "KUBE-KUBELET-CANARY")


@dataclass(frozen=True)
class Backend:
    """The commands one backend needs; ``reader`` picks how hashes are read back.

    ``reader="save"`` parses ``iptables-save``; ``reader="iptc"`` (legacy only)
    reads through libiptc in a helper process run by the same runner, so it
    acts on the same namespace.
    """

    name: BackendName
    save: tuple[str, ...]
    restore: tuple[str, ...]
    reader: Literal["save", "iptc"] = "save"
    ip_version: int = 4

    def v6(self) -> Backend:
        """The same backend for IPv6 (``ip6tables-*``): one Table per family and table."""
        if self.ip_version == 6:
            return self
        return replace(self, save=_v6(self.save), restore=_v6(self.restore), ip_version=6)

    def save_argv(self, table: str | None = None) -> list[str]:
        return [*self.save, *(["-t", table] if table else [])]

    def restore_argv(self) -> list[str]:
        return [*self.restore, "--noflush"]

    def iptc_argv(self, table: str) -> list[str]:
        helper = str(Path(__file__).with_name("legacy_helper.py"))
        return [sys.executable, helper, *(["--ipv6"] if self.ip_version == 6 else []), table]


def _v6(argv: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(arg.replace("iptables-", "ip6tables-", 1) for arg in argv)


NFT = Backend("nft", ("iptables-nft-save",), ("iptables-nft-restore",))
# Legacy takes the xtables lock; wait for it instead of failing at once.
LEGACY = Backend("legacy", ("iptables-legacy-save",), ("iptables-legacy-restore", "--wait", "10"))
LEGACY_IPTC = Backend("legacy", LEGACY.save, LEGACY.restore, reader="iptc")

BACKENDS: dict[str, Backend] = {"nft": NFT, "legacy": LEGACY, "legacy-iptc": LEGACY_IPTC}


def _save(runner: CommandRunner, backend: Backend, table: str | None = None) -> str:
    result = runner.run(backend.save_argv(table))
    return result.stdout if result.ok else ""


def _has_hints(save_output: str) -> bool:
    return any(f":{chain} " in save_output for chain in HINT_CHAINS)


def _count_rules(save_output: str) -> int:
    return sum(1 for line in save_output.splitlines() if line.startswith("-"))


def detect_backend(runner: CommandRunner, override: str | None = None) -> Backend:
    """The backend to program: ``override`` ("nft", "legacy", "legacy-iptc") or detected."""
    if override and override != "auto":
        if override not in BACKENDS:
            raise ValueError(f"unknown iptables backend {override!r}; use {sorted(BACKENDS)}")
        return BACKENDS[override]
    for backend in (NFT, LEGACY):
        if _has_hints(_save(runner, backend, "mangle")):
            log.info("iptables backend %s: kubelet hint chains found", backend.name)
            return backend
    nft_rules, legacy_rules = _count_rules(_save(runner, NFT)), _count_rules(_save(runner, LEGACY))
    chosen = LEGACY if legacy_rules > nft_rules else NFT
    log.info(
        "iptables backend %s: no hint chains (rules: nft=%d legacy=%d)",
        chosen.name,
        nft_rules,
        legacy_rules,
    )
    return chosen
