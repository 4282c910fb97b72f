"""Pod start-up on a real node: a Deployment of 100 pods with 20 NetworkPolicies.

Run as root from the repo root: ``.venv/bin/python tests/bench/pod_startup.py``.

The same one-node real lab (kube-apiserver, scheduler, controller-manager, kubelet,
containerd, kube-proxy) is brought up twice in this run: once with Tabby installed
from manifests/ (the DaemonSet's agent, apiserver IPAM, policy on), once with
Debian's ``ptp`` + ``host-local`` as the cluster's CNI. Each time the same 20
policies are created first (with ptp nothing enforces them), then a Deployment of
N agnhost pods. Two figures per CNI, from the Deployment's creation:

- all Ready: until every pod reports Ready (kubelet's TCP readiness probe, 1 s period);
- first packet: per pod, until a TCP connection from the node to the pod's port
  first succeeds (a prober in the node's netns polls every pod address every 20 ms
  from the moment its address is known).

The last line is ``pod_startup ready_ratio=X first_packet_p99_ms=Y`` (Tabby's
all-Ready time over ptp's, and Tabby's first-packet p99).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
os.environ.setdefault("TABBY_CACHE_DIR", str(REPO / ".cache"))
from lab.kubecluster import AGNHOST_IMAGE, KubeCluster, KubeSpec  # noqa: E402

NAMESPACE = "bench"
PORT = 8080

PROBER = r"""
import queue, socket, sys, threading, time
incoming = queue.Queue()
def read():  # a thread: select() on a buffered stdin misses lines already buffered
    for line in sys.stdin:
        incoming.put(line.strip())
    incoming.put("END")
threading.Thread(target=read, daemon=True).start()
pending = set()
while True:
    try:
        while True:
            item = incoming.get_nowait()
            if item == "END":
                sys.exit(0)
            pending.add(item)
    except queue.Empty:
        pass
    for ip in list(pending):
        s = socket.socket()
        s.settimeout(0.05)
        try:
            s.connect((ip, PORT))
            pending.discard(ip)
            print(f"{ip} {time.time():.6f}", flush=True)
        except OSError:
            pass
        finally:
            s.close()
    time.sleep(0.02)
""".replace("PORT", str(PORT))


def policies(count: int) -> list[dict[str, Any]]:
    """Realistic ingress rules on the bench pods: each admits one client label + port."""
    out = []
    for i in range(count):
        out.append(
            {
                "apiVersion": "networking.k8s.io/v1",
                "kind": "NetworkPolicy",
                "metadata": {"name": f"allow-client-{i}", "namespace": NAMESPACE},
                "spec": {
                    "podSelector": {"matchLabels": {"app": "bench"}},
                    "policyTypes": ["Ingress"],
                    "ingress": [
                        {
                            "from": [{"podSelector": {"matchLabels": {"client": str(i)}}}],
                            "ports": [{"protocol": "TCP", "port": PORT}],
                        }
                    ],
                },
            }
        )
    return out


def deployment(replicas: int) -> dict[str, Any]:
    container = {
        "name": "agnhost",
        "image": AGNHOST_IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "args": ["netexec", f"--http-port={PORT}", "--udp-port=-1"],
        "readinessProbe": {"tcpSocket": {"port": PORT}, "periodSeconds": 1},
        "resources": {"requests": {"cpu": "1m", "memory": "8Mi"}},
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "bench", "namespace": NAMESPACE},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "bench"}},
            "template": {
                "metadata": {"labels": {"app": "bench"}},
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "automountServiceAccountToken": False,
                    "containers": [container],
                },
            },
        },
    }


def pods_state(cluster: KubeCluster) -> list[dict[str, Any]]:
    out = cluster.kubectl("-n", NAMESPACE, "get", "pods", "-o", "json", check=False)
    return json.loads(out)["items"] if out else []


def is_ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def run_once(cni: str, replicas: int, policy_count: int, timeout: float) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix=f"pod-startup-{cni}-"))
    began = time.monotonic()
    cluster = KubeCluster.up(workdir, KubeSpec(nodes=1, cni=cni, max_pods=replicas + 20))
    try:
        up_s = time.monotonic() - began
        print(f"[{cni}] lab up in {up_s:.1f}s", file=sys.stderr)
        cluster.create_namespace(NAMESPACE)
        for policy in policies(policy_count):
            cluster.kubectl("apply", "-f", "-", stdin=json.dumps(policy))
        node = cluster.nodes[0]
        prober = subprocess.Popen(
            ["ip", "netns", "exec", node.netns, sys.executable, "-c", PROBER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        assert prober.stdin is not None and prober.stdout is not None
        try:
            return measure(cluster, prober, replicas, timeout) | {"up_s": up_s}
        finally:
            prober.kill()
            prober.wait()
    finally:
        cluster.down()


def measure(
    cluster: KubeCluster, prober: subprocess.Popen[str], replicas: int, timeout: float
) -> dict[str, Any]:
    assert prober.stdin is not None and prober.stdout is not None
    first: dict[str, float] = {}
    stdout = prober.stdout

    def collect() -> None:  # the prober's "ip time" lines, as they come
        for line in stdout:
            ip, when = line.split()
            first[ip] = float(when)

    reader = threading.Thread(target=collect, daemon=True)
    reader.start()
    start = time.time()
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(deployment(replicas)))
    ready_at: dict[str, float] = {}
    sent: set[str] = set()
    while len(ready_at) < replicas or len(first) < replicas:
        if time.time() - start > timeout:
            raise RuntimeError(
                f"after {timeout:.0f}s: {len(ready_at)}/{replicas} Ready, "
                f"{len(first)}/{replicas} answered"
            )
        now = time.time()
        for pod in pods_state(cluster):
            ip = pod.get("status", {}).get("podIP")
            if ip and ip not in sent:
                prober.stdin.write(ip + "\n")
                prober.stdin.flush()
                sent.add(ip)
            if is_ready(pod) and pod["metadata"]["name"] not in ready_at:
                ready_at[pod["metadata"]["name"]] = now
        time.sleep(0.2)
    prober.stdin.close()
    first_ms = sorted((t - start) * 1000 for t in first.values())
    return {
        "all_ready_s": max(ready_at.values()) - start,
        "first_packet_p50_ms": statistics.median(first_ms),
        "first_packet_p99_ms": first_ms[min(len(first_ms) - 1, int(len(first_ms) * 0.99))],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=100)
    parser.add_argument("--policies", type=int, default=20)
    parser.add_argument("--timeout", type=float, default=400)
    parser.add_argument(
        "--only", choices=["ptp", "tabby"], help="measure one CNI (no ratio: a smoke run)"
    )
    args = parser.parse_args()
    # SIGTERM (timeout, Ctrl-C in a wrapper) unwinds like an exception: the labs go.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if os.geteuid() != 0:
        print("run as root: the lab creates namespaces", file=sys.stderr)
        return 2
    results = {}
    for cni in [args.only] if args.only else ["ptp", "tabby"]:
        results[cni] = run_once(cni, args.replicas, args.policies, args.timeout)
        r = results[cni]
        print(
            f"{cni:6s} all_ready={r['all_ready_s']:.1f}s "
            f"first_packet_p50={r['first_packet_p50_ms']:.0f}ms "
            f"p99={r['first_packet_p99_ms']:.0f}ms (lab up {r['up_s']:.1f}s)"
        )
    if args.only:
        return 0
    ratio = results["tabby"]["all_ready_s"] / results["ptp"]["all_ready_s"]
    print(
        f"pod_startup ready_ratio={ratio:.2f} "
        f"first_packet_p99_ms={results['tabby']['first_packet_p99_ms']:.0f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
