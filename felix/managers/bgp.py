"""BGP as a dataplane manager: its routes, blackholes, neighbours and FDB entries."""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Callable, Iterable, Set
from typing import Any

from bgp.controller import BGPController, BGPInputs
from datastore.models import BGPConfiguration, BGPPeer, BlockAffinity, IPAMBlock, IPPool
from felix.reasons import STATUS_STALE

log = logging.getLogger(__name__)

Objects = Callable[[str], list[dict[str, Any]]]  # an informer's objects, by its name

# Changes that cannot alter what BGP announces or installs: no BGP work for them.
# (An informer name missing here costs a BGP pass per change, never a missed one.)
NOT_BGP_REASONS = frozenset({"pods", "namespaces", "policies", "clusterpolicies", STATUS_STALE})


def secret_values(secrets: Iterable[dict[str, Any]]) -> dict[str, str]:
    """The keys of the BGP password Secret and their values, decoded.

    A value that is not base64 of UTF-8 text is left out and logged (its key only):
    the sessions that name it are then reported as missing their password by bgp/.
    """
    values: dict[str, str] = {}
    for secret in secrets:
        for key, encoded in (secret.get("data") or {}).items():
            try:
                values[key] = base64.b64decode(str(encoded), validate=True).decode()
            except (binascii.Error, UnicodeDecodeError):
                log.warning("BGP password key %r is not text; left out", key)
    return values


def only_non_bgp(reasons: Set[str]) -> bool:
    """Pod, namespace, policy and endpoint changes alone leave BGP as it is."""
    return all(r in NOT_BGP_REASONS or r.startswith("endpoint-") for r in reasons)


class BGPManager:
    """Feeds the BGP controller (:mod:`bgp.controller`: the speaker's configuration and
    the kernel routes it owns) from the caches when something BGP reads has changed.

    ``resync`` also re-reads the kernel's routes, neighbours and FDB entries, so a
    deleted BGP route or a flushed FDB is put back.
    """

    name = "bgp"

    def __init__(
        self,
        controller: BGPController,
        objects: Objects,
        on_invalid: Callable[[int], None],
        on_peers: Callable[[list[dict[str, Any]]], None],
    ) -> None:
        self.controller = controller
        self._objects = objects
        self._on_invalid = on_invalid
        self._on_peers = on_peers
        self._dirty = True  # the first pass programs whatever the caches hold

    def on_update(self, reasons: Set[str]) -> None:
        if not only_non_bgp(reasons):
            self._dirty = True

    def apply(self) -> None:
        if self._dirty:
            self._dirty = False
            self._update(resync=False)

    def resync(self) -> None:
        self._dirty = False
        self._update(resync=True)

    def _update(self, resync: bool) -> None:
        try:
            status = self.controller.update(self._inputs())
            self._on_invalid(status.newly_invalid)  # reported once, by bgp/
            if resync:
                status = self.controller.resync()
        except Exception:
            self._dirty = True  # the retry must do the work again
            raise
        speaker = self.controller.speaker
        self._on_peers(speaker.status_document()["peers"] if speaker else [])
        if status.routes.errors:
            log.warning("BGP route apply reported errors", extra={"errors": status.routes.errors})

    def _inputs(self) -> BGPInputs:
        return BGPInputs(
            passwords=secret_values(self._objects("bgpsecrets")),
            config=self._configuration(),
            nodes=self._objects("nodes"),
            peers=[BGPPeer.from_wire(o) for o in self._objects("bgppeers")],
            affinities=[BlockAffinity.from_wire(o) for o in self._objects("affinities")],
            pools=[IPPool.from_wire(o) for o in self._objects("pools")],
            blocks=[IPAMBlock.from_wire(o) for o in self._objects("blocks")],
        )

    def _configuration(self) -> BGPConfiguration | None:
        for raw in self._objects("bgpconfigs"):
            if raw["metadata"]["name"] == "default":
                return BGPConfiguration.from_wire(raw)
        return None
