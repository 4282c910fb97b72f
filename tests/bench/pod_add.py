"""CNI ADD through the real `tabby-node` against Debian's ptp + host-local, one lab node.

Run as root from the repo root: ``.venv/bin/python tests/bench/pod_add.py``.

What a pod gets, not the plugin alone (``cni_latency.py`` measures that): a one-node
lab (etcd + kube-apiserver, the node's namespace) runs the real agent, ``tabby-node``
with apiserver IPAM, the pod annotation, and policy on: ``--policies`` NetworkPolicies
select the pods, so each ADD returns only once the pod's policy is programmed. Each
pod has its Pod object (as kubelet's pods do) and its network namespace, both made
outside the timed region; each call is the installed plugin executable run inside
the node's namespace with the runtime's environment and stdin, one process per call.
ptp + host-local gets the same calls in the same node, after Tabby.

Three figures per plugin, and its start-up alone:

- start-up: ``--serial`` VERSION calls (median), which each plugin answers itself:
  the floor under any of its ADDs (Tabby's plugin is Python, ptp is Go); and
  ``--burst`` VERSION calls at once (wall time): the floor under a burst;
- serial: ``--serial`` ADDs one after another (median per ADD);
- burst: ``--burst`` ADDs started at once (wall time until the last answers);
- burst4: the same ADDs, 4 at a time (wall time).

Where a burst's CPU goes (the machine's cores are what a burst shares): the CPU
seconds the plugin processes, the agent (with the iptables and ipset processes it
ran) and the apiserver and etcd spent during the burst.

All pods are deleted (CNI DEL) between phases, outside the timed region. The last
line is ``pod_add serial_ratio=X burst_ratio=Y burst4_ratio=Z`` (Tabby over ptp).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from cni.install import conflist  # noqa: E402
from datastore import kinds  # noqa: E402
from lab import netns  # noqa: E402
from lab.cluster import ClusterSpec, LabCluster  # noqa: E402

NAMESPACE = "bench"
CNI_BIN = Path("/usr/lib/cni")
Call = Callable[[str, str, int], float]  # (command, pod netns, index) -> seconds
TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """A process's CPU time so far, with that of the children it has waited for."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) * TICK_S  # utime stime cutime cstime


def children_cpu_seconds() -> float:
    """CPU time of this process's finished children: the plugin processes it ran."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class CPUMeter:
    """CPU seconds spent by the plugins and by each named process between two reads."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self._start: dict[str, float] = {}

    def _now(self) -> dict[str, float]:
        return {"plugins": children_cpu_seconds()} | {
            name: cpu_seconds(pid) for name, pid in self.pids.items()
        }

    def start(self) -> None:
        self._start = self._now()

    def spent(self) -> dict[str, float]:
        return {name: now - self._start[name] for name, now in self._now().items()}


def policies(count: int) -> list[dict[str, Any]]:
    """count policies over the bench pods: ingress from a role, egress to a port."""
    out = []
    for i in range(count):
        spec: dict[str, Any] = {
            "podSelector": {"matchLabels": {"app": "bench"}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": f"client-{i}"}}}]}],
            "egress": [{"ports": [{"protocol": "TCP", "port": 8000 + i}]}],
        }
        out.append({"metadata": {"name": f"bench-{i}", "namespace": NAMESPACE}, "spec": spec})
    return out


def create_pods(cluster: LabCluster, node: str, count: int) -> None:
    """Pod objects bound to the node, as the scheduler leaves them for kubelet."""
    ds = cluster.datastore()
    for i in range(count):
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"p{i}", "namespace": NAMESPACE, "labels": {"app": "bench"}},
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "agnhost"}]},
        }
        ds.create_raw(kinds.POD, body)


def run_call(node_ns: str, argv: list[str], env: dict[str, str], conf: dict[str, Any]) -> float:
    """One plugin process inside the node's namespace; seconds; raises on a CNI error."""
    start = time.perf_counter()
    proc = subprocess.run(
        ["ip", "netns", "exec", node_ns, *argv],
        input=json.dumps(conf).encode(),
        env=env,
        capture_output=True,
        check=False,
        timeout=300,
    )
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[-1]} {env['CNI_COMMAND']}: {proc.stdout!r} {proc.stderr!r}")
    return elapsed


def caller(node_ns: str, plugin: Path, conf: dict[str, Any], tag: str) -> Call:
    def call(command: str, pod_ns: str, index: int) -> float:
        env = {
            "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
            "CNI_COMMAND": command,
            "CNI_CONTAINERID": f"{tag}{index:04d}",
            "CNI_NETNS": f"/run/netns/{pod_ns}",
            "CNI_IFNAME": "eth0",
            "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE={NAMESPACE};K8S_POD_NAME=p{index}",
            "CNI_PATH": str(plugin.parent),
        }
        return run_call(node_ns, [str(plugin)], env, conf)

    return call


def wait_for_teardowns(node_ns: str, timeout: float = 60.0) -> None:
    """Tabby answers DEL first and removes the veth after: wait for that to finish."""
    deadline = time.monotonic() + timeout
    while " cali" in netns.ip(node_ns, "-o", "link", "show"):
        if time.monotonic() > deadline:
            raise RuntimeError("Tabby's deferred teardowns did not finish")
        time.sleep(0.05)


def agent_add_phases(log_path: Path, container_ids: set[str]) -> dict[str, float]:
    """Median seconds per step of the agent's ADDs of these containers, from its log
    (each ADD's line carries ``phases_ms``): where a Tabby ADD's time goes."""
    steps: dict[str, list[float]] = {}
    for line in log_path.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if entry.get("container_id") in container_ids and "phases_ms" in entry:
            for phase, ms in entry["phases_ms"].items():
                steps.setdefault(phase, []).append(ms / 1000)
    return {phase: statistics.median(values) for phase, values in steps.items()}


def phases(
    call: Call,
    pods: Sequence[str],
    serial: int,
    burst: int,
    settle: Callable[[], None],
    meter: CPUMeter,
    after_serial: Callable[[], None] = lambda: None,
) -> dict[str, float]:
    """start-up (a VERSION call) and serial medians (s), burst and burst4 wall times (s),
    the burst's CPU seconds per process (``cpu_NAME``); pods deleted after each."""

    def delete(count: int) -> None:
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda i: call("DEL", pods[i], i), range(count)))
        settle()

    # The plugin's own start-up, doing no work (VERSION is answered by the plugin
    # itself): the least any ADD of that plugin can take.
    startup = statistics.median(call("VERSION", pods[0], 0) for _ in range(serial))
    start = time.perf_counter()
    with ThreadPoolExecutor(burst) as pool:
        list(pool.map(lambda i: call("VERSION", pods[i], i), range(burst)))
    startup_burst = time.perf_counter() - start
    serial_times = [call("ADD", pods[i], i) for i in range(serial)]
    after_serial()
    delete(serial)
    out = {
        "startup": startup,
        "startup_burst": startup_burst,
        "serial": statistics.median(serial_times),
        "serial_max": max(serial_times),
    }
    for name, width in (("burst", burst), ("burst4", 4)):
        meter.start()
        start = time.perf_counter()
        with ThreadPoolExecutor(width) as pool:
            list(pool.map(lambda i: call("ADD", pods[i], i), range(burst)))
        out[name] = time.perf_counter() - start
        if name == "burst":
            out |= {f"cpu_{k}": v for k, v in meter.spent().items()}
        delete(burst)
    return out


def bench(work: Path, serial: int, burst: int, policy_count: int) -> dict[str, dict[str, float]]:
    cluster = LabCluster.up(work / "lab", ClusterSpec(nodes=1))
    made: list[str] = []
    try:
        node = cluster.nodes[0]
        cluster.create_namespace(NAMESPACE)
        for policy in policies(policy_count):
            cluster.apply_policy(policy)
        count = max(serial, burst)
        create_pods(cluster, node.name, count)
        tag = secrets.token_hex(3)
        for i in range(count):
            name = f"tbt-{tag}-pa{i}"
            netns.add(name)
            made.append(name)
        # The plugin's network config exactly as the lab's own CNI calls pass it.
        config = conflist(
            socket=str(cluster.run_dir(node.name) / "cni.sock"),
            chain_portmap=False,
            chain_bandwidth=False,
        )
        plugin: dict[str, Any] = config["plugins"][0]  # type: ignore[index]
        tabby_conf = {"cniVersion": config["cniVersion"], "name": config["name"], **plugin}
        ptp_conf = {
            "cniVersion": "1.0.0",
            "name": "bench",
            "type": "ptp",
            "ipam": {"type": "host-local", "subnet": "10.82.0.0/24", "dataDir": str(work / "hl")},
        }
        results: dict[str, dict[str, float]] = {}
        tabby = caller(node.netns, cluster.cni_bin_dir / "tabby", tabby_conf, "tabby")

        assert cluster.lab is not None
        agent_log = next(p for p in cluster.lab.processes if p.name == f"tabby-node-{node.name}")

        def read_phases() -> None:
            serial_ids = {f"tabby{i:04d}" for i in range(serial)}
            results["tabby-agent"] = agent_add_phases(agent_log.log_path, serial_ids)

        assert cluster.cp is not None and agent_log.pid is not None
        servers = {
            name: proc.pid
            for name, proc in (("apiserver", cluster.cp.apiserver), ("etcd", cluster.cp.etcd))
            if proc is not None and proc.pid is not None
        }
        tabby_meter = CPUMeter({"agent": agent_log.pid, **servers})
        results["tabby"] = phases(
            tabby, made, serial, burst, lambda: wait_for_teardowns(node.netns), tabby_meter,
            read_phases,
        )  # fmt: skip
        ptp = caller(node.netns, CNI_BIN / "ptp", ptp_conf, "ptp")
        results["ptp"] = phases(ptp, made, serial, burst, lambda: None, CPUMeter(servers))
        return results
    finally:
        for name in made:
            netns.delete(name)
        cluster.down()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serial", type=int, default=40, help="serial ADDs per plugin")
    parser.add_argument("--burst", type=int, default=100, help="ADDs per burst")
    parser.add_argument("--policies", type=int, default=20, help="NetworkPolicies on the pods")
    opts = parser.parse_args()
    if os.geteuid() != 0:
        print("needs root (network namespaces)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="tbt-podadd-") as work:
        results = bench(Path(work), opts.serial, opts.burst, opts.policies)
    agent = results.pop("tabby-agent")
    print(
        "tabby agent, serial ADD median per step: "
        + ", ".join(f"{name} {sec * 1000:.1f} ms" for name, sec in agent.items())
    )
    for plugin, figures in results.items():
        print(
            f"{plugin}: serial p50 {figures['serial'] * 1000:.0f} ms "
            f"(max {figures['serial_max'] * 1000:.0f} ms, n={opts.serial}), "
            f"{opts.burst} at once {figures['burst']:.2f} s, "
            f"{opts.burst} 4 at a time {figures['burst4']:.2f} s"
        )
    tabby, ptp = results["tabby"], results["ptp"]
    print(
        f"plugin start-up (VERSION, no work): tabby {tabby['startup'] * 1000:.1f} ms, "
        f"ptp {ptp['startup'] * 1000:.1f} ms; a Tabby ADD doing no work at all would be "
        f"serial_ratio {tabby['startup'] / ptp['serial']:.2f}"
    )
    print(
        f"{opts.burst} start-ups at once: tabby {tabby['startup_burst']:.2f} s, "
        f"ptp {ptp['startup_burst']:.2f} s; a Tabby burst doing no work at all would be "
        f"burst_ratio {tabby['startup_burst'] / ptp['burst']:.2f}"
    )
    cores = os.cpu_count() or 1
    for plugin, figures in results.items():
        spent = {k[4:]: v for k, v in figures.items() if k.startswith("cpu_")}
        print(
            f"{plugin}: CPU seconds during {opts.burst} at once: "
            + ", ".join(f"{name} {sec:.2f}" for name, sec in spent.items())
            + f" (total {sum(spent.values()):.2f} of the {cores * figures['burst']:.2f} "
            f"that {cores} cores had)"
        )
    ratios = {k: tabby[k] / ptp[k] for k in ("serial", "burst", "burst4")}
    print(
        f"pod_add serial_ratio={ratios['serial']:.2f} burst_ratio={ratios['burst']:.2f} "
        f"burst4_ratio={ratios['burst4']:.2f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
