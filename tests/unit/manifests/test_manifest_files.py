"""The deployment manifests, read as files: structure, cross-references, least privilege,
and the pieces of shell and Python they carry, run here against stubs.

The same files are applied to a real apiserver in tests/integration/manifests.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import stat
import subprocess
import textwrap
import threading
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from bgp.config import BGP_SECRET
from cni import install
from controllers import main as gc_main
from datastore import incluster
from datastore.client import Datastore
from datastore.memory import MemoryTransport
from datastore.models import IPPool
from datastore.transport import HttpTransport
from felix import agent
from ipam.pools import validate_pool
from tabbyctl.main import cli
from tests.rbac_table import documented_grants, documented_named_grants

REPO = Path(__file__).resolve().parents[3]
MANIFESTS = REPO / "manifests"
NAMESPACE = "kube-system"
NOT_IN_KUSTOMIZATION = {"kustomization.yaml", "kind-config.yaml"}


def load(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((MANIFESTS / name).read_text()) if d]


def one(name: str, kind: str) -> dict[str, Any]:
    [doc] = [d for d in load(name) if d["kind"] == kind]
    return doc


def own_files() -> list[str]:
    return sorted(p.name for p in MANIFESTS.glob("*.yaml") if p.name not in NOT_IN_KUSTOMIZATION)


def all_objects() -> list[dict[str, Any]]:
    return [doc for name in own_files() for doc in load(name)]


@pytest.fixture(scope="module")
def config() -> dict[str, str]:
    data: dict[str, str] = one("configmap.yaml", "ConfigMap")["data"]
    return data


@pytest.fixture(scope="module")
def daemonset() -> dict[str, Any]:
    return one("daemonset.yaml", "DaemonSet")


@pytest.fixture(scope="module")
def deployment() -> dict[str, Any]:
    return one("controllers.yaml", "Deployment")


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


def containers(workload: dict[str, Any]) -> list[dict[str, Any]]:
    spec = pod_spec(workload)
    return [*spec.get("initContainers", []), *spec["containers"]]


def env_of(container: dict[str, Any], config: dict[str, str]) -> dict[str, str]:
    """The container's environment as kubelet builds it (ConfigMap keys resolved)."""
    env = {}
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
        elif "configMapKeyRef" in var["valueFrom"]:
            env[var["name"]] = config[var["valueFrom"]["configMapKeyRef"]["key"]]
        else:
            env[var["name"]] = f"<{var['valueFrom']['fieldRef']['fieldPath']}>"
    return env


def expand(arg: str, env: dict[str, str]) -> str:
    """kubelet's $(VAR) expansion in command and args (unknown names stay as written)."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m[1], m[0]), arg)


# -- the files and the kustomization ---------------------------------------------------------


def test_kustomization_lists_every_manifest_and_every_crd() -> None:
    listed = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())["resources"]
    crds = sorted(f"crds/{p.name}" for p in (MANIFESTS / "crds").glob("*.yaml"))
    assert sorted(listed) == sorted([*own_files(), *crds])
    assert len(listed) == len(set(listed))
    assert all((MANIFESTS / item).is_file() for item in listed)


def test_every_object_is_labelled_and_placed() -> None:
    objects = all_objects()
    assert {o["kind"] for o in objects} >= {
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
        "DaemonSet",
        "Deployment",
        "IPPool",
    }
    cluster_scoped = {
        "Namespace",
        "ClusterRole",
        "ClusterRoleBinding",
        "IPPool",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }
    for obj in objects:
        meta = obj["metadata"]
        labels = meta.get("labels", {})
        assert labels.get("app.kubernetes.io/part-of") == "tabby", meta["name"]
        assert labels.get("app.kubernetes.io/name"), meta["name"]
        if obj["kind"] in cluster_scoped:
            assert "namespace" not in meta, meta["name"]
        else:
            assert meta["namespace"] == NAMESPACE, meta["name"]
    names = [(o["kind"], o["metadata"]["name"]) for o in objects]
    assert len(names) == len(set(names)), "an object is defined twice"


def test_workload_selectors_match_their_pod_labels(
    daemonset: dict[str, Any], deployment: dict[str, Any]
) -> None:
    for workload in (daemonset, deployment):
        selector = workload["spec"]["selector"]["matchLabels"]
        labels = workload["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= labels.items()
        assert labels["app.kubernetes.io/part-of"] == "tabby"
    assert daemonset["spec"]["selector"] != deployment["spec"]["selector"]


# -- cross-references --------------------------------------------------------------------------


def test_workloads_run_as_accounts_that_are_bound(
    daemonset: dict[str, Any], deployment: dict[str, Any]
) -> None:
    rbac = load("rbac.yaml")
    accounts = {d["metadata"]["name"] for d in rbac if d["kind"] == "ServiceAccount"}
    roles = {d["metadata"]["name"] for d in rbac if d["kind"] == "ClusterRole"}
    bound = {}
    for binding in (d for d in rbac if d["kind"] == "ClusterRoleBinding"):
        assert binding["roleRef"]["name"] in roles
        for subject in binding["subjects"]:
            assert subject == {
                "kind": "ServiceAccount",
                "name": subject["name"],
                "namespace": NAMESPACE,
            }
            bound[subject["name"]] = binding["roleRef"]["name"]
    assert pod_spec(daemonset)["serviceAccountName"] == "tabby-node"
    assert pod_spec(deployment)["serviceAccountName"] == "tabby-controllers"
    for workload in (daemonset, deployment):
        account = pod_spec(workload)["serviceAccountName"]
        assert account in accounts
        assert bound[account] == account  # each account has its own role


def test_configmap_references_resolve(
    config: dict[str, str], daemonset: dict[str, Any], deployment: dict[str, Any]
) -> None:
    used = set()
    for workload in (daemonset, deployment):
        for container in containers(workload):
            for var in container.get("env", []):
                ref = var.get("valueFrom", {}).get("configMapKeyRef")
                if ref:
                    assert ref["name"] == "tabby-config"
                    assert ref["key"] in config, f"{var['name']}: no key {ref['key']}"
                    used.add(ref["key"])
            for arg in [*container.get("command", []), *container.get("args", [])]:
                for name in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", arg):
                    assert name in env_of(container, config), f"$({name}) is not defined"
    # Every key is read by a container, except the documented reference value.
    assert set(config) - used == {"ipv4_pool_cidr"}


def test_volume_mounts_have_volumes(daemonset: dict[str, Any], deployment: dict[str, Any]) -> None:
    for workload in (daemonset, deployment):
        volumes = {v["name"] for v in pod_spec(workload)["volumes"]}
        mounted = {m["name"] for c in containers(workload) for m in c.get("volumeMounts", [])}
        assert mounted == volumes


def test_one_image_everywhere_and_it_is_the_package_version(
    daemonset: dict[str, Any], deployment: dict[str, Any]
) -> None:
    images = {c["image"] for w in (daemonset, deployment) for c in containers(w)}
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert images == {f"tabby:{version}"}
    assert f"tabby:{version}" in (REPO / "Dockerfile").read_text()


def test_dockerfile_copies_every_package() -> None:
    """The image copies packages one by one (no .venv in it): keep the list complete."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    packages = {p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    dockerfile = (REPO / "Dockerfile").read_text()
    copied = set(re.findall(r"^COPY (\w+)/ \1/$", dockerfile, re.M))
    assert copied == packages
    assert re.search(r"^FROM python:3\.11-slim$", dockerfile, re.M)
    assert 'ENTRYPOINT ["tabby-node"]' in dockerfile
    for package in ("iptables", "ipset", "iproute2", "conntrack"):
        assert re.search(rf"apt-get install [^\n]*\b{package}\b", dockerfile), package


# -- the pool, the ConfigMap and kind agree -----------------------------------------------------


def test_default_pool_is_valid_and_matches_the_cluster(config: dict[str, str]) -> None:
    raw = one("default-ippool.yaml", "IPPool")
    pool = IPPool.from_wire(raw)
    validate_pool(pool)  # the IPAM code's own checks
    assert pool.name == "default-ipv4-ippool"
    assert (pool.spec.cidr, pool.spec.block_size) == ("10.244.0.0/16", 26)
    assert (pool.spec.ipip_mode, pool.spec.vxlan_mode) == ("Never", "CrossSubnet")
    assert pool.spec.nat_outgoing is True
    kind = yaml.safe_load((MANIFESTS / "kind-config.yaml").read_text())
    pod_subnet = ipaddress.ip_network(kind["networking"]["podSubnet"])
    assert ipaddress.ip_network(pool.spec.cidr).subnet_of(pod_subnet)
    assert config["ipv4_pool_cidr"] == pool.spec.cidr
    service = ipaddress.ip_network(kind["networking"]["serviceSubnet"])
    assert not service.overlaps(pod_subnet)


def test_kind_config() -> None:
    kind = yaml.safe_load((MANIFESTS / "kind-config.yaml").read_text())
    assert kind["apiVersion"] == "kind.x-k8s.io/v1alpha4"
    assert kind["networking"]["disableDefaultCNI"] is True
    assert [n["role"] for n in kind["nodes"]] == ["control-plane", "worker", "worker"]


def test_mtu_leaves_room_for_vxlan(config: dict[str, str]) -> None:
    assert int(config["veth_mtu"]) <= 1500 - 50


# -- least privilege ---------------------------------------------------------------------------


# (apiGroup, resource) -> verbs; the complete grant of each role, as documented in
# docs/deploy.md's RBAC table (tests/rbac_table.py), so the doc and the roles agree.
def _expected_rules() -> dict[str, dict[tuple[str, str], set[str]]]:
    rules: dict[str, dict[tuple[str, str], set[str]]] = {}
    for account, grants in documented_grants().items():
        for verb, qualified in grants:
            name, slash, subresource = qualified.partition("/")  # "X.group/status"
            resource, _, group = name.partition(".")
            key = (group, resource + slash + subresource)
            rules.setdefault(account, {}).setdefault(key, set()).add(verb)
    return rules


EXPECTED_RULES = _expected_rules()


@pytest.mark.parametrize("role", sorted(EXPECTED_RULES))
def test_cluster_role_is_exactly_the_table(role: str) -> None:
    [doc] = [
        d for d in load("rbac.yaml") if d["kind"] == "ClusterRole" and d["metadata"]["name"] == role
    ]
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in doc["rules"]:
        assert "resourceNames" not in rule and "nonResourceURLs" not in rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                granted.setdefault((group, resource), set()).update(rule["verbs"])
    flat = {g for g, _ in granted} | {r for _, r in granted} | set().union(*granted.values())
    assert "*" not in flat, "no wildcards"
    assert ("", "secrets") not in granted
    assert granted == EXPECTED_RULES[role]


def test_the_only_namespaced_role_is_the_documented_secret_by_name() -> None:
    """Grants are cluster-wide ClusterRoles (pods and events live in every namespace),
    but for one Role: tabby-node reads the BGP password Secret, by name (issue 40)."""
    docs = load("rbac.yaml")
    # plus the admission policies that narrow what RBAC cannot (issues 21 and 40)
    assert {d["kind"] for d in docs} == {
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }
    granted: dict[str, dict[tuple[str, str, str], set[str]]] = {}
    for role in (d for d in docs if d["kind"] == "Role"):
        [binding] = [
            d
            for d in docs
            if d["kind"] == "RoleBinding" and d["roleRef"]["name"] == role["metadata"]["name"]
        ]
        [subject] = binding["subjects"]
        assert binding["metadata"]["namespace"] == role["metadata"]["namespace"] == NAMESPACE
        for rule in role["rules"]:
            assert rule["resourceNames"], "a Role here names its objects"
            for resource in rule["resources"]:
                for name in rule["resourceNames"]:
                    key = (NAMESPACE, resource, name)
                    granted.setdefault(subject["name"], {}).setdefault(key, set()).update(
                        rule["verbs"]
                    )
    assert granted == documented_named_grants()
    assert granted == {"tabby-node": {(NAMESPACE, "secrets", BGP_SECRET): {"get", "list", "watch"}}}


# Each admission policy that narrows an account's grants (issues 21 and 40): the account.
ACCOUNT_POLICIES = {
    "tabby-node-annotations-only": "tabby-node",
    "tabby-node-own-policy-status": "tabby-node",
    "tabby-controllers-realization-only": "tabby-controllers",
}


def test_account_admission_policies_are_bound_and_match_their_account() -> None:
    docs = load("rbac.yaml")
    policies = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"}
    bindings = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert set(policies) == set(ACCOUNT_POLICIES)
    assert {b["spec"]["policyName"] for b in bindings} == set(policies)
    for binding in bindings:
        assert binding["spec"]["validationActions"] == ["Deny"]
    for name, policy in policies.items():
        assert policy["spec"]["failurePolicy"] == "Fail"
        [condition] = policy["spec"]["matchConditions"]
        account = ACCOUNT_POLICIES[name]
        assert f'"system:serviceaccount:{NAMESPACE}:{account}"' in condition["expression"]


# -- tabby-node: the DaemonSet -----------------------------------------------------------------


def test_daemonset_runs_on_every_node(daemonset: dict[str, Any]) -> None:
    spec = pod_spec(daemonset)
    assert spec["hostNetwork"] is True
    assert spec["hostPID"] is False
    assert spec["tolerations"] == [{"operator": "Exists"}]  # every taint, every effect
    assert spec["priorityClassName"] == "system-node-critical"
    [main] = spec["containers"]
    assert main["securityContext"]["privileged"] is True
    assert main["resources"]["requests"].keys() == {"cpu", "memory"}
    env = env_of(
        main,
        {
            "veth_mtu": "1",
            "iptables_backend": "a",
            "default_endpoint_to_host_action": "Drop",
            "iptables_filter_allow_action": "Accept",
            "pod_to_node_bgp": "Drop",
            "log_level": "b",
            "resync_interval": "2",
        },
    )
    assert env["NODENAME"] == "<spec.nodeName>"


def test_probes_hit_the_agents_health_server(daemonset: dict[str, Any]) -> None:
    [main] = pod_spec(daemonset)["containers"]
    defaults = agent.AgentConfig(node_name="n", kubeconfig="k")
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        get = main[probe]["httpGet"]
        assert get["path"] == path
        assert get["port"] == defaults.health_port == 9099
        # The agent listens on loopback; a hostNetwork pod's IP is the node's.
        assert get["host"] == defaults.health_host == "127.0.0.1"


def test_host_paths(daemonset: dict[str, Any]) -> None:
    volumes = {v["name"]: v for v in pod_spec(daemonset)["volumes"]}
    paths = {
        v["hostPath"]["path"]: v["hostPath"].get("type")
        for v in volumes.values()
        if "hostPath" in v
    }
    assert paths == {
        "/run/tabby": "DirectoryOrCreate",
        "/opt/cni/bin": "DirectoryOrCreate",
        "/etc/cni/net.d": "DirectoryOrCreate",
        "/lib/modules": None,
        "/run/xtables.lock": "FileOrCreate",
        "/var/run/netns": "DirectoryOrCreate",
    }
    [main] = pod_spec(daemonset)["containers"]
    mounts = {m["mountPath"]: m for m in main["volumeMounts"]}
    assert mounts["/lib/modules"]["readOnly"] is True
    # sandboxes mounted after the agent started must still be visible to it
    assert mounts["/var/run/netns"]["mountPropagation"] == "HostToContainer"
    assert volumes[mounts["/run/tabby"]["name"]]["hostPath"]["path"] == "/run/tabby"


def test_install_cni_writes_what_the_agent_serves(
    daemonset: dict[str, Any], config: dict[str, str], tmp_path: Path
) -> None:
    """Run the init container's command line (host paths moved under tmp_path)."""
    [init] = pod_spec(daemonset)["initContainers"]
    env = env_of(init, config)
    argv = [expand(a, env) for a in init["command"]]
    assert argv[0] == "tabbyctl"
    mounts = {m["mountPath"] for m in init["volumeMounts"]}
    assert mounts == {"/host/opt/cni/bin", "/host/etc/cni/net.d"}
    # The image's executables are hack/build-cni.sh's (lab/images.py copies them there).
    built = Path(
        subprocess.run(
            [str(REPO / "hack" / "build-cni.sh")], capture_output=True, text=True, check=True
        ).stdout.strip()
    ).parent
    assert f"--from={install.EXECUTABLES_DIR}" in argv
    moved = [
        a.replace("=/host/", f"={tmp_path}/host/").replace(
            f"--from={install.EXECUTABLES_DIR}", f"--from={built}"
        )
        for a in argv[1:]
    ]
    result = CliRunner().invoke(cli, moved)
    assert result.exit_code == 0, result.output
    conflist = json.loads((tmp_path / "host/etc/cni/net.d/10-tabby.conflist").read_text())
    [plugin] = [p for p in conflist["plugins"] if p["type"] == "tabby"]
    socket = str(
        agent.AgentConfig(node_name="n", kubeconfig="k", run_dir=Path("/run/tabby")).cni_socket
    )
    assert plugin["agent_socket"] == socket
    assert plugin["mtu"] == int(config["veth_mtu"])
    # What a node runs: the static executables, no script for an interpreter it may lack.
    for name in ("tabby", "portmap", "bandwidth"):
        copied = tmp_path / "host/opt/cni/bin" / name
        assert copied.read_bytes() == (built / name).read_bytes()
        assert copied.read_bytes()[:4] == b"\x7fELF"
        assert copied.stat().st_mode & stat.S_IXUSR
    assert [p["type"] for p in conflist["plugins"]] == ["tabby", "portmap", "bandwidth"]
    assert "chained plugins not found" not in result.output


def _stub(directory: Path, name: str, body: str) -> None:
    path = directory / name
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(0o755)


KUBELET_ENV = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}


@pytest.fixture
def in_pod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This process as a pod sees itself: kubelet's service variables, the ServiceAccount
    mount (here under tmp_path), and no kubeconfig anywhere."""
    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    (sa / "token").write_text("token-of-the-pod\n")
    (sa / "ca.crt").write_text("not read until a connection is made\n")
    monkeypatch.setattr(incluster, "SERVICE_ACCOUNT_DIR", sa)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    for name, value in KUBELET_ENV.items():
        monkeypatch.setenv(name, value)
    return sa


def _run_script(
    container: dict[str, Any], config: dict[str, str], tmp_path: Path, extra_env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """The container's `sh -c` script, with kubelet's environment and stubbed commands."""
    assert container["command"] == ["/bin/sh", "-c"]
    [script] = container["args"]
    env = env_of(container, config)
    env.update(extra_env)
    env["PATH"] = f"{tmp_path / 'bin'}:/usr/bin:/bin"
    env.update(KUBELET_ENV)
    return subprocess.run(
        ["/bin/sh", "-c", expand(script, env)],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        cwd=tmp_path,
    )


def test_workloads_reach_the_apiserver_as_their_service_account(
    daemonset: dict[str, Any], deployment: dict[str, Any]
) -> None:
    """No kubeconfig is written or pointed to: the programs read the ServiceAccount mount
    kubelet gives every pod (in-cluster configuration)."""
    for workload in (daemonset, deployment):
        spec = pod_spec(workload)
        assert spec.get("automountServiceAccountToken", True) is True
        for container in spec["containers"]:
            assert "KUBECONFIG" not in {e["name"] for e in container.get("env", [])}
            mounts = [m["mountPath"] for m in container.get("volumeMounts", [])]
            assert not [m for m in mounts if m.startswith("/var/run/secrets")], mounts
            command = " ".join(container["command"] + container.get("args", []))
            assert "kubeconfig" not in command.lower()


@pytest.mark.parametrize(
    ("ip_output", "node_ip"),
    [
        (
            "1: lo    inet 127.0.0.1/8 scope host lo\\n"
            "2: eth0    inet 172.18.0.3/16 brd 172.18.255.255 scope global eth0\\n",
            "172.18.0.3/16",
        ),
        ("1: lo    inet 127.0.0.1/8 scope host lo\\n", "172.18.0.3/32"),
    ],
    ids=["prefix-from-interface", "no-interface-falls-back-to-32"],
)
def test_node_start_script_gives_the_agent_valid_flags(
    daemonset: dict[str, Any],
    config: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    in_pod: Path,
    ip_output: str,
    node_ip: str,
) -> None:
    (tmp_path / "bin").mkdir()
    _stub(tmp_path / "bin", "ip", f'printf "{ip_output}"\n')
    _stub(tmp_path / "bin", "tabby-node", f'for a in "$@"; do echo "$a"; done > {tmp_path}/argv\n')
    [main] = pod_spec(daemonset)["containers"]
    result = _run_script(
        main, config, tmp_path, {"HOST_IP": "172.18.0.3", "NODENAME": "kind-worker"}
    )
    assert result.returncode == 0, result.stderr
    argv = (tmp_path / "argv").read_text().splitlines()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["argv", "bin", "serviceaccount"]
    # The agent's own parser accepts exactly these flags with this environment.
    monkeypatch.setenv("NODENAME", "kind-worker")
    monkeypatch.setenv("TABBY_RUN_DIR", "/run/tabby")
    parsed = agent.parse_args(argv)
    assert parsed.node_name == "kind-worker"
    assert parsed.node_ip == node_ip
    assert parsed.mtu == int(config["veth_mtu"])
    assert parsed.log_level == config["log_level"]
    assert parsed.resync_interval_s == float(config["resync_interval"])
    assert parsed.run_dir == Path("/run/tabby")
    assert parsed.cni_socket == Path("/run/tabby/cni.sock")
    assert parsed.kubeconfig is None  # in-cluster
    transport = Datastore.connect(parsed.kubeconfig).transport
    assert isinstance(transport, HttpTransport)
    assert transport.host == "https://10.96.0.1:443"
    assert transport._auth_headers()["Authorization"] == "Bearer token-of-the-pod"


def test_controllers_run_ipam_gc_passes(
    deployment: dict[str, Any],
    config: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    in_pod: Path,
) -> None:
    """The Deployment runs tabby-controllers itself, which (with the Deployment's
    environment, in a pod) opens the in-cluster datastore, runs GC passes at the
    interval and touches the liveness file."""
    [main] = pod_spec(deployment)["containers"]
    assert main["command"] == ["tabby-controllers"]
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["tabby-controllers"] == "controllers.main:main"
    assert "args" not in main

    env = env_of(main, config)
    heartbeat = tmp_path / "alive"
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("HEARTBEAT_FILE", str(heartbeat))
    # The policy status thread's informers need watches, which memory does not serve
    # (tests/unit/controllers/test_controllers_main.py checks that main runs it).
    monkeypatch.setenv("POLICY_STATUS", "off")
    ds = Datastore(MemoryTransport())
    real_in_cluster = Datastore.in_cluster
    opened: list[str] = []

    def in_cluster(cls: type[Datastore], *args: Any) -> Datastore:
        transport = real_in_cluster(*args).transport
        assert isinstance(transport, HttpTransport)
        opened.append(transport.host)
        return ds  # the real one, but over memory: no apiserver here

    monkeypatch.setattr(Datastore, "in_cluster", classmethod(in_cluster))
    waits: list[float | None] = []

    def wait_then_stop(self: threading.Event, timeout: float | None = None) -> bool:
        waits.append(timeout)
        self.set()  # as SIGTERM's handler does
        return True

    monkeypatch.setattr(threading.Event, "wait", wait_then_stop)
    assert gc_main.main([]) == 0
    assert opened == ["https://10.96.0.1:443"]
    assert waits == [float(env["GC_INTERVAL_SECONDS"])]
    assert heartbeat.exists(), "a successful pass touches the liveness file"
    probe = main["livenessProbe"]["exec"]["command"]
    assert env["HEARTBEAT_FILE"] in probe[-1]
    assert float(env["GC_GRACE_SECONDS"]) == 900.0
    mounts = {m["mountPath"]: m["name"] for m in main["volumeMounts"]}
    assert mounts[str(Path(env["HEARTBEAT_FILE"]).parent)] == "scratch"
    assert main["securityContext"]["readOnlyRootFilesystem"] is True


def test_controllers_deployment_shape(deployment: dict[str, Any]) -> None:
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    spec = pod_spec(deployment)
    assert spec.get("hostNetwork") is None
    assert spec["securityContext"]["runAsNonRoot"] is True
    [main] = spec["containers"]
    assert main["securityContext"]["allowPrivilegeEscalation"] is False
    assert os.path.isabs(main["livenessProbe"]["exec"]["command"][0])


# -- the kind script and the docs ---------------------------------------------------------------


def test_kind_script_explains_missing_tools(tmp_path: Path) -> None:
    """Without docker and kind (as on the CI machines) it stops at once and says why."""
    (tmp_path / "bin").mkdir()
    for tool in ("dirname",):  # the only outside command it runs before checking
        (tmp_path / "bin" / tool).symlink_to(f"/usr/bin/{tool}")
    result = subprocess.run(
        ["/bin/bash", str(REPO / "hack/kind-conformance.sh"), "up"],
        env={"PATH": str(tmp_path / "bin")},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 1
    assert "missing: docker kind kubectl curl tar" in result.stderr
    assert "cannot run where there is no Docker daemon" in result.stderr


def test_kind_script_uses_the_manifests() -> None:
    script = (REPO / "hack/kind-conformance.sh").read_text()
    assert "--config manifests/kind-config.yaml" in script
    assert "kind load docker-image" in script
    assert "apply --server-side -k manifests/" in script
    assert "--provider=local" in script
    assert "Netpol" in script


def test_deploy_doc_covers_every_setting(config: dict[str, str]) -> None:
    doc = (REPO / "docs/deploy.md").read_text()
    for key in config:
        assert f"`{key}`" in doc, f"docs/deploy.md does not explain {key}"
    for needle in ("/healthz", "/readyz", "/metrics", "tabbyctl node status", "tabbyctl ipam show"):
        assert needle in doc
