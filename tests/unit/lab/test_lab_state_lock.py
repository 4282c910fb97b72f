"""Concurrent `tabbyctl lab pod create` calls must not lose each other's pods (issue 21 item 10).

Each call is its own process: it loads cluster.json, runs a CNI ADD (seconds on a
real lab), then records its pod. Here N real processes run LabCluster.create_pod on a
real state file; only the outside parts (apiserver, netns, the plugin) are stubbed,
and every ADD waits until all N processes have loaded the state, which is the race
a person meets when starting pods from several shells.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from dataclasses import asdict
from pathlib import Path

from lab.cluster import ClusterSpec

REPO = Path(__file__).resolve().parents[3]
N = 8

CHILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from lab import cluster as mod

    workdir, index, n = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])

    class FakeDatastore:
        transport = type("T", (), {"request": staticmethod(lambda *a, **k: {})})()
        def create_raw(self, *_a): return {"metadata": {"uid": f"uid-{index}"}}

    class FakeLab:
        lab_id = None  # cluster.json stays loadable without a real Lab
        def ns(self, role): return f"tlab-test-{role}"

    def add(node, command, cid, pod_ns, namespace, name, uid):
        (workdir / f"loaded-{index}").touch()
        deadline = time.monotonic() + 30
        while len(list(workdir.glob("loaded-*"))) < n and time.monotonic() < deadline:
            time.sleep(0.01)  # every process has read the state before anyone writes
        return {"ips": [{"address": f"10.244.0.{index + 10}/32"}]}

    mod.netns.exists = lambda _ns: True
    c = mod.LabCluster.load(workdir)
    c.lab = FakeLab()
    c.datastore = FakeDatastore
    c.cni = add
    c.create_pod("default", f"pod-{index}", "node1")
    """
)


def test_concurrent_pod_creates_keep_every_pod(tmp_path: Path) -> None:
    state = {"spec": asdict(ClusterSpec()), "lab_id": None, "apiserver_port": 1, "pods": {}}
    (tmp_path / "cluster.json").write_text(json.dumps(state))
    procs = [
        subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path), str(i), str(N)], cwd=REPO)
        for i in range(N)
    ]
    assert [p.wait(timeout=60) for p in procs] == [0] * N
    pods = json.loads((tmp_path / "cluster.json").read_text())["pods"]
    assert sorted(pods) == sorted(f"default/pod-{i}" for i in range(N))
    assert {p["ip"] for p in pods.values()} == {f"10.244.0.{i + 10}" for i in range(N)}
    assert {p["uid"] for p in pods.values()} == {f"uid-{i}" for i in range(N)}
    assert not list(tmp_path.glob("cluster.json.*tmp*")), "a temp file was left behind"
