"""`tabbyctl lab`: a whole Tabby cluster on this machine, in network namespaces.

    tabbyctl lab up [--nodes 3] [--subnets 1] [--proxy-mode iptables|nftables]
                                 real nodes: kubelet + containerd + kube-proxy, Tabby
                                 installed from manifests/ (the default)
    tabbyctl lab up --no-kubelet [--bgp mesh|reflectors] [--encap none|vxlan|ipip]
                                 agents only: the lab writes Pods and makes CNI calls
    tabbyctl lab demo            pods, a Service, node status, IPAM, a matrix, a policy
    tabbyctl lab status
    tabbyctl lab pod create NS/NAME --node node1 [--label k=v]
    tabbyctl lab pod delete NS/NAME
    tabbyctl lab exec NS/NAME -- CMD...
    tabbyctl lab down

The lab's control plane, node namespaces and agents outlive this command; `down`
removes all of it. Nothing is added to the host's own network namespace.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import click

from lab.cluster import ClusterSpec, LabCluster
from lab.kubecluster import KubeCluster, KubeSpec, load_lab, tabby_pods_by_node
from lab.podlab import clear_workdir
from tabbyctl.output import emit_data, emit_table, fail, output_option

DEFAULT_WORKDIR = Path(os.environ.get("TABBY_LAB_DIR", "/run/tabby-labs/default"))
workdir_option = click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_WORKDIR,
    show_default=True,
    help="Where the lab keeps its state ($TABBY_LAB_DIR).",
)

DEMO_POLICY = {
    "metadata": {"name": "web-allow-clients", "namespace": "demo"},
    "spec": {
        "podSelector": {"matchLabels": {"app": "web"}},
        "policyTypes": ["Ingress"],
        "ingress": [
            {
                "from": [
                    {"namespaceSelector": {}, "podSelector": {"matchLabels": {"role": "client"}}}
                ]
            }
        ],
    },
}


AnyLab = LabCluster | KubeCluster


def _load(workdir: Path) -> AnyLab:
    if not (workdir / "cluster.json").exists():
        fail(f"no lab in {workdir}: run `tabbyctl lab up` first (or pass --workdir)")
    return load_lab(workdir)


def _pod_key(value: str) -> tuple[str, str]:
    namespace, sep, name = value.partition("/")
    if not sep or not namespace or not name:
        fail(f"pods are named NAMESPACE/NAME, got {value!r}")
    return namespace, name


@click.group("lab")
def lab() -> None:
    """A multi-node Tabby cluster on this machine, for trying things out."""


@lab.command("up")
@click.option("--nodes", type=click.IntRange(1, 32), default=3, show_default=True)
@click.option("--subnets", type=click.IntRange(1, 8), default=1, show_default=True)
@click.option(
    "--kubelet/--no-kubelet",
    default=True,
    show_default=True,
    help="Real nodes (kubelet, containerd, kube-proxy; Tabby from manifests/), or agents only.",
)
@click.option(
    "--proxy-mode",
    type=click.Choice(["iptables", "nftables"]),
    default="iptables",
    show_default=True,
    help="kube-proxy's mode (real nodes).",
)
@click.option(
    "--bgp",
    type=click.Choice(["mesh", "reflectors"]),
    default="mesh",
    show_default=True,
    help="Agents only: --no-kubelet.",
)
@click.option(
    "--encap",
    type=click.Choice(["none", "vxlan", "ipip"]),
    default="none",
    show_default=True,
    help="Agents only: --no-kubelet (real nodes use the manifests' pool: VXLAN CrossSubnet).",
)
@workdir_option
def up(
    nodes: int,
    subnets: int,
    kubelet: bool,
    proxy_mode: str,
    bgp: str,
    encap: str,
    workdir: Path,
) -> None:
    """Start the control plane and N nodes, each with Tabby."""
    if os.geteuid() != 0:
        fail("the lab creates network namespaces: run it as root")
    if subnets > nodes:
        fail(f"--subnets ({subnets}) cannot exceed --nodes ({nodes})")
    if kubelet and (bgp != "mesh" or encap != "none"):
        fail("--bgp and --encap apply to --no-kubelet labs; real nodes use manifests/")
    if (workdir / "cluster.json").exists():
        fail(f"a lab already exists in {workdir}: `tabbyctl lab down` first, or use --workdir")
    began = time.monotonic()
    progress = _progress(began)
    cluster: AnyLab
    if kubelet:
        kspec = KubeSpec(nodes=nodes, subnets=subnets, proxy_mode=proxy_mode)
        cluster = KubeCluster.up(workdir, kspec, progress=progress)
        what = f"{nodes} nodes (kubelet, containerd, kube-proxy {proxy_mode}), Tabby DaemonSet"
    else:
        spec = ClusterSpec(nodes=nodes, subnets=subnets, bgp=bgp, encap=encap)
        cluster = LabCluster.up(workdir, spec, progress=progress)
        what = f"{nodes} nodes, BGP {bgp}, encapsulation {encap}"
    click.echo(f"lab up in {time.monotonic() - began:.0f}s: {what}")
    click.echo(f"  export KUBECONFIG={cluster.kubeconfig}")


def _progress(began: float) -> Callable[[str], None]:
    def report(message: str) -> None:
        click.echo(f"  [{time.monotonic() - began:5.1f}s] {message}")

    return report


@lab.command("status")
@workdir_option
@output_option
def status(workdir: Path, output: str) -> None:
    """Nodes, their agents, and the lab's pods."""
    cluster = _load(workdir)
    agents = _agent_states(cluster)
    nodes = [
        {
            "name": n.name,
            "netns": n.netns,
            "address": str(n.address),
            "agent": agents.get(n.name, "not running"),
            "run_dir": str(cluster.run_dir(n.name)),
        }
        for n in cluster.nodes
    ]
    pods = [{"pod": p.key, "node": p.node, "ip": p.ip} for p in cluster.pods.values()]
    if output != "table":
        emit_data({"kubeconfig": str(cluster.kubeconfig), "nodes": nodes, "pods": pods}, output)
        return
    emit_table(
        "Nodes",
        ["NODE", "ADDRESS", "AGENT", "NAMESPACE"],
        [[n["name"], n["address"], n["agent"], n["netns"]] for n in nodes],
    )
    emit_table("Pods", ["POD", "NODE", "IP"], [[p["pod"], p["node"], p["ip"]] for p in pods])
    click.echo(f"export KUBECONFIG={cluster.kubeconfig}")


def _agent_states(cluster: AnyLab) -> dict[str, str]:
    """Per node: the agent's state (its DaemonSet pod on real nodes, its process else)."""
    if isinstance(cluster, KubeCluster):
        return {
            node: f"{pod['pod']} {'ready' if pod['ready'] else 'not ready'}"
            for node, pod in tabby_pods_by_node(cluster).items()
        }
    return {n.name: "running" for n in cluster.nodes if _agent_running(cluster, n.name)}


def _agent_running(cluster: LabCluster, node: str) -> bool:
    import json

    try:
        pid = int(json.loads((cluster.run_dir(node) / "status.json").read_text())["pid"])
    except (OSError, ValueError, KeyError):
        return False
    return Path(f"/proc/{pid}").exists()


@lab.group("pod")
def pod() -> None:
    """Create or delete lab pods (through the CNI path)."""


@pod.command("create")
@click.argument("key")
@click.option(
    "--node", help="Node to run the pod on, e.g. node1 (real nodes: the scheduler's choice)."
)
@click.option("--label", "labels", multiple=True, help="k=v, repeatable.")
@workdir_option
def pod_create(key: str, node: str | None, labels: tuple[str, ...], workdir: Path) -> None:
    """Create NS/NAME: a real Pod (real nodes), or Pod object + sandbox + CNI ADD."""
    namespace, name = _pod_key(key)
    cluster = _load(workdir)
    if node is None and isinstance(cluster, LabCluster):
        fail("--node is required for a --no-kubelet lab")
    if node is not None and node not in [n.name for n in cluster.nodes]:
        fail(f"no node {node!r}; nodes: {', '.join(n.name for n in cluster.nodes)}")
    parsed = {}
    for label in labels:
        k, sep, v = label.partition("=")
        if not sep or not k:
            fail(f"labels are k=v, got {label!r}")
        parsed[k] = v
    if isinstance(cluster, KubeCluster):
        made = cluster.create_pod(namespace, name, node, parsed)
        click.echo(f"pod {made.key} on {made.node}: {made.ip}")
        return
    assert node is not None
    info = cluster.create_pod(namespace, name, node, parsed)
    click.echo(f"pod {info.key} on {info.node}: {info.ip}")


@pod.command("delete")
@click.argument("key")
@workdir_option
def pod_delete(key: str, workdir: Path) -> None:
    """CNI DEL, then remove the sandbox namespace and the Pod object."""
    namespace, name = _pod_key(key)
    cluster = _load(workdir)
    if key not in cluster.pods:
        fail(f"no lab pod {key}; see `tabbyctl lab status`")
    cluster.delete_pod(namespace, name)
    click.echo(f"pod {key} deleted")


@lab.command("exec", context_settings={"ignore_unknown_options": True})
@click.argument("key")
@click.argument("argv", nargs=-1, required=True, type=click.UNPROCESSED)
@workdir_option
def exec_cmd(key: str, argv: tuple[str, ...], workdir: Path) -> None:
    """Run a command in a pod's network namespace: lab exec NS/NAME -- ping 10.244.1.2."""
    cluster = _load(workdir)
    if key not in cluster.pods:
        fail(f"no lab pod {key}; see `tabbyctl lab status`")
    proc = subprocess.run([*cluster.netns_argv(key), *argv], check=False)
    sys.exit(proc.returncode)


@lab.command("down")
@workdir_option
def down(workdir: Path) -> None:
    """Stop everything the lab started and remove its namespaces."""
    cluster = _load(workdir)
    cluster.down()
    clear_workdir(workdir)  # etcd data, certificates, node dirs: nothing carries over
    (workdir / "cluster.json").unlink(missing_ok=True)
    (workdir / "cluster.json.lock").unlink(missing_ok=True)  # lab/podlab.py _save's lock
    click.echo("lab removed")


# -- the demo -----------------------------------------------------------------------------
def _matrix(cluster: AnyLab, title: str) -> None:
    keys = sorted(cluster.pods)
    rows = []
    for src in keys:
        row = [src]
        for dst in keys:
            row.append(
                "-"
                if src == dst
                else ("ok" if cluster.can_reach(src, dst, timeout_s=1) else "DENIED")
            )
        rows.append(row)
    emit_table(title, ["FROM \\ TO", *keys], rows)


@lab.command("demo")
@workdir_option
def demo(workdir: Path) -> None:
    """Demo pods on every node, node status, IPAM, and a policy's effect on traffic."""
    cluster = _load(workdir)
    tabbyctl = [sys.executable, "-m", "tabbyctl.main", "--kubeconfig", str(cluster.kubeconfig)]
    nodes = [n.name for n in cluster.nodes]
    real = isinstance(cluster, KubeCluster)
    if isinstance(cluster, KubeCluster):
        _show(cluster, "get", "nodes", "-o", "wide")
        _show(cluster, "-n", TABBY_NAMESPACE, "get", "ds", "tabby-node")
    how = "as real Pods (scheduler, kubelet, CRI, Tabby)" if real else "through the CNI path"
    click.echo(f"\nCreating demo pods {how} ...")
    for i, node in enumerate(nodes):
        if f"demo/web-{i + 1}" not in cluster.pods:
            cluster.create_pod("demo", f"web-{i + 1}", node, {"app": "web"})
    if "demo/client" not in cluster.pods:
        cluster.create_pod("demo", "client", nodes[-1], {"role": "client"})
    if "other/intruder" not in cluster.pods:
        cluster.create_pod("other", "intruder", nodes[0], {"role": "intruder"})
    if isinstance(cluster, KubeCluster):
        _show(cluster, "get", "pods", "-A", "-o", "wide")
        _service_demo(cluster, "before any NetworkPolicy")
    time.sleep(2)  # let BGP carry the new blocks
    for node in nodes:
        click.echo(f"\n$ tabbyctl node status   # on {node}")
        subprocess.run(
            [*tabbyctl, "node", "status", "--run-dir", str(cluster.run_dir(node))], check=False
        )
    click.echo("\n$ tabbyctl ipam show --show-blocks")
    subprocess.run([*tabbyctl, "ipam", "show", "--show-blocks"], check=False)
    _matrix(cluster, "Connectivity before any NetworkPolicy (ICMP)")
    click.echo(
        "\nApplying NetworkPolicy demo/web-allow-clients: pods app=web accept only role=client"
    )
    cluster.apply_policy(DEMO_POLICY)
    time.sleep(2)
    _matrix(cluster, "Connectivity with the policy")
    if isinstance(cluster, KubeCluster):
        _service_demo(cluster, "with the policy")
    click.echo(f"""
Try next:
  export KUBECONFIG={cluster.kubeconfig}
  tabbyctl lab status
  tabbyctl lab exec demo/client -- ping -c1 {cluster.pods["demo/web-1"].ip}
  tabbyctl lab pod create demo/web-new --node {nodes[0]} --label app=web
  tabbyctl ipam check
  tabbyctl lab down""")


TABBY_NAMESPACE = "kube-system"
SERVICE = {
    "apiVersion": "v1",
    "kind": "Service",
    "metadata": {"name": "web", "namespace": "demo"},
    "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
}


def _show(cluster: KubeCluster, *args: str) -> None:
    click.echo(f"\n$ kubectl {' '.join(args)}")
    click.echo(cluster.kubectl(*args, check=False).rstrip())


def _service_demo(cluster: KubeCluster, when: str, requests: int = 6) -> None:
    """The ClusterIP Service demo/web, reached through kube-proxy from two pods."""
    import json

    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(SERVICE))
    service = json.loads(cluster.kubectl("-n", "demo", "get", "svc", "web", "-o", "json"))
    address = service["spec"]["clusterIP"]
    url = f"http://{address}/hostname"
    deadline = time.monotonic() + 20  # kube-proxy programs a new Service within seconds
    while time.monotonic() < deadline:
        if cluster.exec("demo/client", ["curl", "-s", "-m", "1", url], timeout=5).returncode == 0:
            break
        time.sleep(0.5)
    rows = []
    for source in ("demo/client", "other/intruder"):
        answers = []
        for _ in range(requests):
            proc = cluster.exec(source, ["curl", "-s", "-m", "2", url], timeout=10)
            answers.append(proc.stdout.strip() if proc.returncode == 0 else "no answer")
        counts = {a: answers.count(a) for a in sorted(set(answers))}
        rows.append([source, ", ".join(f"{a} x{n}" for a, n in counts.items())])
    emit_table(
        f"Service demo/web {address}:80 via kube-proxy, {when}",
        ["FROM", f"ANSWERED BY ({requests} requests)"],
        rows,
    )
