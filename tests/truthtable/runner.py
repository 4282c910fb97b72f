"""Run truth-table cases on a :class:`~tests.truthtable.harness.TruthLab`.

Shared by the bench (every case, both backends) and the integration test (a few
cases, one backend per test), so the test proves the same machinery the bench
reports on.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from tests.truthtable.cases import Action, Case
from tests.truthtable.harness import CheckResult, TruthLab

Report = Callable[[str], None]


@dataclass
class BackendResult:
    """Totals of one backend's run."""

    backend: str
    cases: int = 0
    steps: int = 0
    cells: int = 0
    probes: int = 0
    allowed: int = 0
    same_node: int = 0
    refused: int = 0
    converge_s: list[float] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)

    def add(self, case: str, step: int, result: CheckResult) -> None:
        self.steps += 1
        self.cells += result.cells
        self.probes += result.probes
        self.allowed += result.allowed
        self.same_node += result.same_node
        self.refused += result.refused
        self.converge_s.append(result.converge_s)
        self.mismatches += [f"{self.backend} {case}#{step}: {m}" for m in result.mismatches]


class Changes(Protocol):
    """What an action needs: the lab (apiserver + model) or the model alone."""

    def apply_policy(self, policy: dict[str, Any]) -> None: ...
    def delete_policy(self, namespace: str, name: str) -> None: ...
    def apply_cluster_policy(self, policy: dict[str, Any]) -> None: ...
    def delete_cluster_policy(self, name: str) -> None: ...
    def label_pod(self, key: str, labels: dict[str, str | None]) -> None: ...
    def label_namespace(self, name: str, labels: dict[str, str | None]) -> None: ...


def perform(lab: Changes, action: Action) -> None:
    """Apply one action (to the apiserver and the model, or to the model alone)."""
    if action.kind == "apply":
        lab.apply_policy(*action.args)
    elif action.kind == "delete":
        lab.delete_policy(*action.args)
    elif action.kind == "apply_cnp":
        lab.apply_cluster_policy(*action.args)
    elif action.kind == "delete_cnp":
        lab.delete_cluster_policy(*action.args)
    elif action.kind == "label_pod":
        lab.label_pod(*action.args)
    elif action.kind == "label_ns":
        lab.label_namespace(*action.args)
    else:
        raise ValueError(f"unknown action {action.kind!r}")


def run_cases(lab: TruthLab, cases: Iterable[Case], report: Report) -> BackendResult:
    """Every step of every case, each followed by a full matrix check."""
    total = BackendResult(lab.backend)
    for case in cases:
        lab.reset()
        total.cases += 1
        for index, step in enumerate(case.build(lab.world), start=1):
            started = time.monotonic()
            for action in step.actions:
                perform(lab, action)
            result = lab.check()
            total.add(case.name, index, result)
            verdict = "ok" if not result.mismatches else f"{len(result.mismatches)} MISMATCHES"
            report(
                f"  {lab.backend:6s} {case.name}#{index} {step.what}: {result.allowed}/"
                f"{result.cells} open, {result.probes} probes, settled "
                f"{result.converge_s:.1f} s, step {time.monotonic() - started:.1f} s: {verdict}"
            )
            for line in result.mismatches[:20]:
                report(f"      {line}")
    return total
