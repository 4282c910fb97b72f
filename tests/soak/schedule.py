"""The soak's seeded schedule: what happens, in which order, to which node.

Pure: the same seed and node names give the same events, so a failure found by a
15-minute run is replayed by running the same seed again. The first events cover
every fault kind once (a short run still meets each of them), shuffled among churn;
after that each event is churn or, with :data:`FAULT_SHARE`, a fault, picked by
:data:`FAULT_WEIGHTS`: the long faults (a minute's outage, a node replaced) are rarer,
so a run's minutes go to many short ones rather than to a few waits.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

# Churn: what a busy cluster does to the network all day.
CHURN_KINDS = (
    "pods-create",  # a burst of 1..MAX_BURST pods on one node, all ADDs at once
    "pods-delete",  # some of the churn pods, DEL then the Pod object
    "policy-apply",  # a NetworkPolicy created or edited (names are reused)
    "policy-delete",
    "namespace-relabel",
)
# Faults: what goes wrong. Each names what the runner does, by PID or by hand.
FAULT_KINDS = (
    "agent-kill",  # kill -9 of a node's tabby-node, started again
    "agent-kill-mid-add",  # the same while a burst of ADDs is in flight on that node
    "exabgp-kill",  # kill -9 of a node's ExaBGP (its agent starts it again)
    "apiserver-stop",  # kube-apiserver stopped for a while (etcd keeps the data)
    "route-delete",  # a pod's host route deleted on its node, by hand
    "chain-delete",  # a pod's policy chain flushed on its node, by hand
    "node-replace",  # a spare node's machine lost (Node deleted, GC'd) and joining again
)
MAX_BURST = 50
FAULT_SHARE = 0.25
FAULT_WEIGHTS = {
    "agent-kill": 3,
    "agent-kill-mid-add": 3,
    "exabgp-kill": 2,
    "apiserver-stop": 1,
    "route-delete": 2,
    "chain-delete": 2,
    "node-replace": 1,
}
NEEDS_SPARE = "node-replace"  # only a node without the probed pods may be replaced
CHURN_WEIGHTS = {
    "pods-create": 3,
    "pods-delete": 2,
    "policy-apply": 4,
    "policy-delete": 2,
    "namespace-relabel": 2,
}


@dataclass(frozen=True)
class Event:
    """One step of the schedule. ``seed`` drives the step's own choices (which pods,
    which policy), so a runner's choices replay with the schedule."""

    index: int
    kind: str
    node: str
    count: int
    seed: int

    @property
    def is_fault(self) -> bool:
        return self.kind in FAULT_KINDS

    def describe(self) -> str:
        what = f"{self.kind} on {self.node}"
        return f"#{self.index} {what} x{self.count}" if self.count > 1 else f"#{self.index} {what}"


def schedule(
    seed: int,
    nodes: Sequence[str],
    fault_kinds: Sequence[str] = FAULT_KINDS,
    spares: Sequence[str] = (),
) -> Iterator[Event]:
    """Endless events: the runner takes them until its time is up (and at least until
    every fault kind in *fault_kinds* has happened once). Events happen on any of
    *nodes*; ``node-replace`` only on one of *spares* (nodes among them)."""
    if not nodes:
        raise ValueError("a schedule needs at least one node")
    unknown = sorted(set(fault_kinds) - set(FAULT_KINDS))
    if unknown:
        raise ValueError(f"unknown fault kinds: {', '.join(unknown)}")
    if NEEDS_SPARE in fault_kinds and not spares:
        raise ValueError(f"{NEEDS_SPARE} needs a spare node (one without probed pods)")
    strays = sorted(set(spares) - set(nodes))
    if strays:
        raise ValueError(f"spare nodes not among the nodes: {', '.join(strays)}")
    rng = random.Random(seed)
    opening = _opening(rng, list(fault_kinds))
    index = 0
    while True:
        kind = opening.pop(0) if opening else _next_kind(rng, fault_kinds)
        yield _event(rng, index, kind, spares if kind == NEEDS_SPARE else nodes)
        index += 1


def _opening(rng: random.Random, faults: list[str]) -> list[str]:
    """Each fault once, in a random order, each after one or two churn events."""
    rng.shuffle(faults)
    out: list[str] = []
    for fault in faults:
        out += [_churn(rng) for _ in range(rng.randint(1, 2))]
        out.append(fault)
    return out


def _next_kind(rng: random.Random, faults: Sequence[str]) -> str:
    if faults and rng.random() < FAULT_SHARE:
        return rng.choices(list(faults), weights=[FAULT_WEIGHTS[f] for f in faults])[0]
    return _churn(rng)


def _churn(rng: random.Random) -> str:
    kinds = list(CHURN_WEIGHTS)
    return rng.choices(kinds, weights=[CHURN_WEIGHTS[k] for k in kinds])[0]


def _event(rng: random.Random, index: int, kind: str, nodes: Sequence[str]) -> Event:
    count = 1
    if kind == "pods-create":
        count = rng.randint(1, MAX_BURST)
    elif kind in ("agent-kill-mid-add", "node-replace"):  # the ADDs in flight, or after
        count = rng.randint(5, 20)
    elif kind == "pods-delete":
        count = rng.randint(1, MAX_BURST // 2)
    return Event(index, kind, rng.choice(list(nodes)), count, rng.getrandbits(32))
