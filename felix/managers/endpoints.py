"""Pod wiring as a dataplane manager: veths, /32 routes and sysctls, repaired on resync."""

from __future__ import annotations

from collections.abc import Callable, Set


class EndpointWiring:
    """What CNI ADD wired and DEL has not removed (the CNI server's endpoint table).

    ADD and DEL write the kernel themselves, on the CNI path, so ``apply`` has nothing
    queued. ``resync`` compares every endpoint with the kernel (one link and one route
    dump for the node) and re-wires what drifted. It takes each pod's CNI lock, so it
    must never run inside a pass an ADD waits for (the agent runs it in the loop only).
    """

    name = "endpoints"

    def __init__(self, repair: Callable[[], list[str]]) -> None:
        self._repair = repair
        self.repaired: list[str] = []  # host veths the last resync put back

    def on_update(self, reasons: Set[str]) -> None:
        del reasons  # endpoints change through CNI calls, not through watch events

    def apply(self) -> None:
        """Nothing queued: ADD and DEL have written their pods already."""

    def resync(self) -> None:
        self.repaired = self._repair()
