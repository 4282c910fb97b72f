"""CNI ADD/DEL latency: Tabby (shim + agent) against Debian's ptp + host-local.

Run as root: ``.venv/bin/python tests/bench/cni_latency.py --n 50``. Both plugins
run exactly as a runtime runs them (the installed executable, env + stdin, one
process per call) inside a node namespace this script creates; pods are
namespaces created outside the timed region. Everything is removed at the end, also on failure.

The last line is ``cni add_ratio=X del_ratio=Y`` (Tabby median / ptp median;
below 1 means Tabby is faster).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from cni.install import install_shim  # noqa: E402

PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
CNI_BIN = Path("/usr/lib/cni")


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=60)


def call(node: str, argv: list[str], env: dict[str, str], conf: dict[str, Any]) -> float:
    """One plugin call; returns seconds, raises on a CNI error."""
    start = time.perf_counter()
    proc = subprocess.run(
        ["ip", "netns", "exec", node, *argv],
        input=json.dumps(conf).encode(),
        env=env,
        capture_output=True,
        check=False,
        timeout=120,
    )
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[-1]} {env['CNI_COMMAND']}: {proc.stdout!r} {proc.stderr!r}")
    return elapsed


def run_plugin(
    node: str, pods: list[str], argv: list[str], conf: dict[str, Any]
) -> tuple[list[float], list[float]]:
    """ADD every pod, then DEL every pod; per-call latencies."""
    adds, dels = [], []
    for command, out in (("ADD", adds), ("DEL", dels)):
        for i, pod in enumerate(pods):
            env = {
                "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
                "CNI_COMMAND": command,
                "CNI_CONTAINERID": f"bench{i}",
                "CNI_NETNS": f"/var/run/netns/{pod}",
                "CNI_IFNAME": "eth0",
                "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE=bench;K8S_POD_NAME=p{i}",
                "CNI_PATH": str(CNI_BIN),
            }
            out.append(call(node, argv, env, conf))
    return adds, dels


def start_agent(node: str, sock: str, log: Path) -> subprocess.Popen[bytes]:
    cmd = ["ip", "netns", "exec", node, sys.executable, "-m", "felix.cni_server"]
    cmd += ["--socket", sock, "--pool", "10.81.0.0/24"]
    with log.open("wb") as out:
        agent = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while not os.path.exists(sock):
        if agent.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"agent did not start: {log.read_text()}")
        time.sleep(0.05)
    return agent


def summary(name: str, values: list[float]) -> str:
    ms = sorted(v * 1000 for v in values)
    p90 = ms[max(0, round(len(ms) * 0.9) - 1)]
    p99 = ms[max(0, round(len(ms) * 0.99) - 1)]
    return (
        f"{name}: p50 {statistics.median(ms):.1f} ms, p90 {p90:.1f} ms, p99 {p99:.1f} ms, "
        f"n={len(ms)}"
    )


def _agent_times(log: Path) -> dict[str, list[float]]:
    """Per-call handler time from the agent's log ("ADD ... in 12 ms").

    DEL logs twice: when it is answered, and when its deferred teardown (veth,
    then address) has finished after the answer.
    """
    times: dict[str, list[float]] = {"ADD": [], "DEL answered": [], "DEL teardown": []}
    for line in log.read_text().splitlines():
        words = line.split()
        if len(words) < 5 or words[3] not in ("ADD", "DEL"):
            continue
        if "answered in" in line:
            times["DEL answered"].append(float(words[words.index("answered") + 2]))
        elif "torn down in" in line:
            times["DEL teardown"].append(float(words[words.index("down") + 2]))
        elif words[-1] == "ms":
            times[words[3] if words[3] == "ADD" else "DEL answered"].append(float(words[-2]))
    return times


def wait_for_teardowns(node: str, timeout: float = 30.0) -> None:
    """Let Tabby's deferred DEL work finish before the peer is measured."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        links = subprocess.run(
            ["ip", "-n", node, "-o", "link", "show"], capture_output=True, text=True, check=True
        ).stdout
        if " cali" not in links:
            return
        time.sleep(0.05)
    raise RuntimeError("Tabby's deferred teardowns did not finish")


def bench(n: int, work: Path) -> tuple[float, float]:
    tag = secrets.token_hex(3)
    node = f"tbt-{tag}-bnode"
    pods = [f"tbt-{tag}-b{i}" for i in range(n)]
    made: list[str] = []
    agent = None
    try:
        for name in (node, *pods):
            sh("ip", "netns", "add", name)
            made.append(name)
        sh("ip", "-n", node, "link", "set", "lo", "up")
        sock = str(work / "run" / "cni.sock")
        agent = start_agent(node, sock, work / "agent.log")
        tabby_conf = {"cniVersion": "1.0.0", "name": "bench", "type": "tabby", "agent_socket": sock}
        ptp_conf = {
            "cniVersion": "1.0.0",
            "name": "bench",
            "type": "ptp",
            "ipam": {"type": "host-local", "subnet": "10.82.0.0/24", "dataDir": str(work / "ipam")},
        }
        plugin = install_shim(work / "bin", PYTHON)  # as `tabbyctl cni install` does
        t_add, t_del = run_plugin(node, pods, [str(plugin)], tabby_conf)
        wait_for_teardowns(node)
        p_add, p_del = run_plugin(node, pods, [str(CNI_BIN / "ptp")], ptp_conf)
    finally:
        if agent is not None:
            agent.terminate()
            agent.wait(timeout=10)
        for name in made:
            subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)
    for name, values in (
        ("tabby ADD", t_add),
        ("tabby DEL", t_del),
        ("ptp ADD", p_add),
        ("ptp DEL", p_del),
    ):
        print(summary(name, values))
    agent = _agent_times(work / "agent.log")
    for phase, values in agent.items():
        if values:
            print(f"tabby agent-side {phase}: median {statistics.median(values):.1f} ms")
    add_ratio = statistics.median(t_add) / statistics.median(p_add)
    del_ratio = statistics.median(t_del) / statistics.median(p_del)
    return add_ratio, del_ratio


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=50, help="pods per plugin (>= 50 to report)")
    opts = parser.parse_args()
    if os.geteuid() != 0:
        print("needs root (network namespaces)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="tbt-bench-") as work:
        add_ratio, del_ratio = bench(opts.n, Path(work))
    print(f"cni add_ratio={add_ratio:.2f} del_ratio={del_ratio:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
