"""What both labs share: their pods in `<workdir>/cluster.json`, and ping between pods.

`LabCluster` (agents only, the lab makes CNI calls) and `KubeCluster` (real nodes)
keep the same state file, so `tabbyctl lab ...` calls from other processes find
either lab and its pods again.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from lab.process import PidRegistry
from lab.statefile import atomic_write, locked
from lab.topology import Lab

# A lab work dir's state besides cluster.json: the control plane (etcd data,
# certificates), the nodes' dirs, the installed CNI plugin.
STATE_DIRS = ("controlplane", "nodes", "cni-bin")


class Keyed(Protocol):
    @property
    def key(self) -> str: ...

    @property
    def ip(self) -> str: ...


PodT = TypeVar("PodT", bound=Keyed)


def clear_workdir(workdir: Path) -> None:
    """What an earlier lab left in its work dir: its daemons (by PID) and its state.

    `tabbyctl lab up` refuses a work dir with a cluster.json, so anything else there
    is stale; an old etcd data dir would otherwise bring back that lab's Nodes and
    Pods into the new cluster.
    """
    PidRegistry(workdir / "controlplane" / "pids.json").kill_leftovers()
    for name in STATE_DIRS:
        shutil.rmtree(workdir / name, ignore_errors=True)


class PodLab(Generic[PodT]):
    """Pods recorded under a lock, and ICMP reachability between them."""

    mode: ClassVar[str] = "agents"
    pod_type: type[PodT]
    workdir: Path
    spec: Any
    lab: Lab | None
    apiserver_port: int
    pods: dict[str, PodT]

    def exec(
        self, pod: str, argv: Sequence[str], timeout: float = 30
    ) -> subprocess.CompletedProcess[str]:
        raise NotImplementedError

    def can_reach(self, src: str, dst: str, timeout_s: int = 2, attempts: int = 2) -> bool:
        """ICMP from one pod to another's address (a first ARP may take one attempt)."""
        target = self.pods[dst].ip
        for _ in range(attempts):
            proc = self.exec(
                src, ["ping", "-c1", "-W", str(timeout_s), target], timeout=timeout_s + 5
            )
            if proc.returncode == 0:
                return True
        return False

    def _extra_state(self) -> dict[str, Any]:
        """What a lab kind adds to cluster.json."""
        return {}

    def _save(
        self, added: PodT | None = None, removed: str | None = None, *, fresh: bool = False
    ) -> None:
        """Record this process's change to cluster.json: read-modify-write under a lock.

        Each `tabbyctl lab pod create` is its own process that loaded the state before
        its (seconds-long) ADD; writing its whole view back would drop the pods that
        others added meanwhile. So the pods are re-read under an exclusive flock, only
        this call's pod is added or removed, and the file is replaced atomically (a
        reader never sees half a file). The new view is built apart and then put in
        place, so threads of one process (the soak's bursts) may add and remove pods
        at once too.
        """
        path = self.workdir / "cluster.json"
        with locked(self.workdir / "cluster.json.lock"):
            if path.exists() and not fresh:
                stored = json.loads(path.read_text()).get("pods", {})
                pods = {k: self.pod_type(**v) for k, v in stored.items()}
            else:
                pods = dict(self.pods)  # one C-level copy: no thread changes it midway
            if added is not None:
                pods[added.key] = added
            if removed is not None:
                pods.pop(removed, None)
            state = {
                "mode": self.mode,
                "spec": asdict(self.spec),
                "lab_id": self.lab.lab_id if self.lab else None,
                "apiserver_port": self.apiserver_port,
                "pods": {k: asdict(v) for k, v in pods.items()},  # type: ignore[call-overload]
                **self._extra_state(),
            }
            atomic_write(path, json.dumps(state, indent=1))
            self.pods = pods
