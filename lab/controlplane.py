"""A real Kubernetes control plane for tests, the lab and the demo: etcd + kube-apiserver.

Both listen on the host's loopback only (127.0.0.1, ports chosen free), so the host's
network namespace gets no new address, link or route. Lab node namespaces reach the
apiserver through a relay over a unix socket (see `expose_unix_socket` and
`lab.topology`). Everything started here is stopped by PID, also when a test fails.

    with ControlPlane.start(workdir) as cp:
        ds = cp.datastore()            # Tabby's CRDs are installed
        print(cp.kubeconfig)           # admin kubeconfig (group system:masters)
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from datastore.client import Datastore
from datastore.errors import AlreadyExists, DatastoreError, Invalid, NotFound, Unavailable
from datastore.kinds import CRD_KINDS, IPPOOL
from lab.pki import CertificateAuthority, write_service_account_key
from lab.process import ManagedProcess, PidRegistry

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parent.parent
CRD_DIR = REPO / "manifests" / "crds"
READY_TIMEOUT_S = 120.0
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
ADMISSION = REPO / "manifests" / "ippool-admission.yaml"
ADMISSION_PROBE_CLEAN = "198.18.255.0/24"  # benchmarking range: no test or lab pool uses it
ADMISSION_API = "/apis/admissionregistration.k8s.io/v1"
ADMISSION_PLURALS = {
    "ValidatingAdmissionPolicy": "validatingadmissionpolicies",
    "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings",
}
SERVICE_CIDR = "10.96.0.0/16"
LAB_APISERVER_PORT = 6443
NODELAY = "nodelay"  # socat: TCP_NODELAY on a relayed TCP leg (see expose_unix_socket)


class ControlPlaneError(RuntimeError):
    """The control plane could not be started; the message carries the daemon's log tail."""


def k8s_bin_dir() -> Path:
    """Where hack/build-k8s.sh put kube-apiserver, kubectl and etcd."""
    override = os.environ.get("TABBY_K8S_BIN")
    if override:
        return Path(override)
    out = subprocess.run(
        [str(REPO / "hack" / "build-k8s.sh"), "--print"], capture_output=True, text=True, check=True
    )
    return Path(out.stdout.strip())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ControlPlane:
    """etcd and kube-apiserver in a work dir, with certificates and an admin kubeconfig."""

    def __init__(
        self,
        workdir: Path,
        bin_dir: Path | None = None,
        *,
        netns: str | None = None,
        address: str | None = None,
    ) -> None:
        self.workdir = workdir
        self.bin_dir = bin_dir or k8s_bin_dir()
        self.pki = workdir / "pki"
        self.kubeconfig = workdir / "kubeconfig"
        # With a netns (the real-node lab), etcd and the apiserver run inside it at
        # `address`, where kubelets reach them and they reach kubelets (exec, logs);
        # the host reaches the apiserver on 127.0.0.1:apiserver_port through a relay.
        self.netns, self.address = netns, address
        self.lab_kubeconfig = workdir / "kubeconfig-lab"
        self.etcd_port = 2379 if netns else free_port()
        self.etcd_peer_port = 2380 if netns else free_port()
        self.apiserver_port = free_port()
        self.pids = PidRegistry(workdir / "pids.json")
        self.etcd: ManagedProcess | None = None
        self.apiserver: ManagedProcess | None = None
        self.relay: ManagedProcess | None = None
        self.host_relay: ManagedProcess | None = None
        self.scheduler: ManagedProcess | None = None
        self.controller_manager: ManagedProcess | None = None
        self.startup_seconds = 0.0
        self.admission_installed = False

    # -- lifecycle ----------------------------------------------------------------------
    @classmethod
    def start(
        cls,
        workdir: Path,
        bin_dir: Path | None = None,
        *,
        netns: str | None = None,
        address: str | None = None,
    ) -> ControlPlane:
        """Start etcd and the apiserver, install CRDs; stops what it started on failure."""
        workdir.mkdir(parents=True, exist_ok=True)
        cp = cls(workdir, bin_dir, netns=netns, address=address)
        cp.pids.kill_leftovers()
        began = time.monotonic()
        try:
            cp._write_pki()
            cp.start_etcd()
            if netns:
                cp.expose_unix_socket()
                cp._relay_to_host()
            cp.start_apiserver()
            cp.install_crds()
            cp.install_admission()
        except BaseException:
            cp.stop()
            raise
        cp.startup_seconds = time.monotonic() - began
        log.info("control plane ready in %.1fs at %s", cp.startup_seconds, cp.url)
        return cp

    def __enter__(self) -> ControlPlane:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop the relays, the controllers, the apiserver, then etcd, each by PID."""
        for attr in (
            "host_relay",
            "relay",
            "controller_manager",
            "scheduler",
            "apiserver",
            "etcd",
        ):
            proc: ManagedProcess | None = getattr(self, attr)
            if proc is not None:
                proc.stop()
                self.pids.forget(proc.name)
                setattr(self, attr, None)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    @property
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self.etcd_port}"

    def pids_running(self) -> list[int]:
        procs = (
            self.etcd,
            self.apiserver,
            self.relay,
            self.host_relay,
            self.scheduler,
            self.controller_manager,
        )
        return [p.pid for p in procs if p is not None and p.pid is not None and p.alive()]

    def datastore(self) -> Datastore:
        return Datastore.from_kubeconfig(str(self.kubeconfig))

    # -- etcd ---------------------------------------------------------------------------
    def start_etcd(self) -> None:
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        self.etcd = self._launch(
            "etcd",
            [
                str(self.bin_dir / "etcd"),
                "--name=default",
                f"--data-dir={self.workdir / 'etcd-data'}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=default={peer}",
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
        )
        self._wait(self.etcd, self._etcd_healthy, "etcd")

    def _etcd_healthy(self) -> bool:
        if self.netns:  # not reachable from the host: ask from inside
            argv = ["curl", "-sf", "-m2", f"{self.etcd_url}/health"]
            out = subprocess.run(
                ["nsenter", f"--net=/run/netns/{self.netns}", *argv],
                capture_output=True,
                check=False,
            )
            return out.returncode == 0 and b'"true"' in out.stdout
        try:
            with urllib.request.urlopen(f"{self.etcd_url}/health", timeout=2) as resp:
                return bool(json.load(resp).get("health") == "true")
        except OSError:
            return False

    def etcd_call(self, endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
        """Call etcd's v3 JSON gateway (e.g. 'kv/range', 'kv/compaction')."""
        request = urllib.request.Request(
            f"{self.etcd_url}/v3/{endpoint}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as resp:
            result: dict[str, Any] = json.load(resp)
            return result

    def compact_etcd(self) -> int:
        """Compact etcd's history up to now, so old resourceVersions expire; returns it."""
        key = base64.b64encode(b"/").decode()
        revision = int(self.etcd_call("kv/range", {"key": key})["header"]["revision"])
        self.etcd_call("kv/compaction", {"revision": revision, "physical": True})
        return revision

    # -- kube-apiserver -----------------------------------------------------------------
    def _write_pki(self) -> None:
        self.pki.mkdir(exist_ok=True)
        ca = CertificateAuthority(self.pki)
        ca.issue(
            "apiserver",
            "kube-apiserver",
            server_names=(
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ),
            server_ips=("127.0.0.1", "10.96.0.1", *([self.address] if self.address else [])),
        )
        admin = ca.issue("admin", "tabby-admin", organization="system:masters")
        write_service_account_key(self.pki)
        self._write_kubeconfig(ca.cert_path, admin.cert, admin.key)
        if self.address:  # for the lab's own daemons: kubelet, kube-proxy, controllers
            lab_url = f"https://{self.address}:{LAB_APISERVER_PORT}"
            self._write_kubeconfig(
                ca.cert_path, admin.cert, admin.key, self.lab_kubeconfig, lab_url
            )

    def _write_kubeconfig(
        self, ca: Path, cert: Path, key: Path, path: Path | None = None, url: str | None = None
    ) -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "tabby-lab",
                    "cluster": {"server": url or self.url, "certificate-authority": str(ca)},
                }
            ],
            "users": [
                {
                    "name": "tabby-admin",
                    "user": {"client-certificate": str(cert), "client-key": str(key)},
                }
            ],
            "contexts": [
                {"name": "tabby-lab", "context": {"cluster": "tabby-lab", "user": "tabby-admin"}}
            ],
            "current-context": "tabby-lab",
        }
        path = path or self.kubeconfig
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)

    def start_apiserver(self) -> None:
        """(Re)start kube-apiserver against the running etcd; waits for /readyz."""
        pki = self.pki
        self.apiserver = self._launch(
            "kube-apiserver",
            [
                str(self.bin_dir / "kube-apiserver"),
                f"--etcd-servers={self.etcd_url}",
                *self._apiserver_listen_flags(),
                f"--cert-dir={pki}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                "--authorization-mode=RBAC",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                # Kubernetes <= 1.32 accepted CIDRs with host bits set (10.0.0.5/8) and
                # such stored objects live on (validation ratcheting): accept them too, so
                # Tabby's masking of them is tested end to end.
                "--feature-gates=StrictIPCIDRValidation=false",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki / 'sa.key'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                *self._apiserver_node_flags(),
                "--allow-privileged=true",
                "--enable-priority-and-fairness=false",
                "--profiling=false",
                "--v=1",
            ],
        )
        self._wait(self.apiserver, self._apiserver_ready, "kube-apiserver")
        if self.admission_installed:  # a restart: the policies must work again first
            self.wait_admission()

    def _apiserver_listen_flags(self) -> list[str]:
        if not self.netns:
            return [
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.apiserver_port}",
            ]
        return [
            f"--bind-address={self.address}",
            f"--advertise-address={self.address}",
            f"--secure-port={LAB_APISERVER_PORT}",
        ]

    def _apiserver_node_flags(self) -> list[str]:
        """Without kubelets no pod needs a token; with them, pods get ServiceAccounts
        and the apiserver dials kubelets by InternalIP (there is no DNS for names)."""
        if not self.netns:
            return ["--disable-admission-plugins=ServiceAccount"]
        return ["--kubelet-preferred-address-types=InternalIP"]

    def stop_apiserver(self) -> None:
        """Stop only the apiserver (etcd keeps the data), e.g. to test watch recovery."""
        if self.apiserver is not None:
            self.apiserver.stop()
            self.pids.forget(self.apiserver.name)
            self.apiserver = None

    def _apiserver_ready(self) -> bool:
        try:
            self.datastore().transport.request("GET", "/readyz", timeout=3)
            return True
        except DatastoreError:
            return False

    # -- CRDs ---------------------------------------------------------------------------
    def install_crds(self, directory: Path = CRD_DIR) -> list[str]:
        """Create (or leave) every CRD in directory and wait until each is Established."""
        transport = self.datastore().transport
        names = []
        for path in sorted(directory.glob("*.yaml")):
            for doc in yaml.safe_load_all(path.read_text()):
                if not doc:
                    continue
                names.append(doc["metadata"]["name"])
                with contextlib.suppress(AlreadyExists):
                    transport.request("POST", CRD_PATH, body=doc)
        deadline = time.monotonic() + READY_TIMEOUT_S
        pending = set(names)
        while pending and time.monotonic() < deadline:
            pending = {n for n in pending if not self._crd_established(n)}
            if pending:
                time.sleep(0.1)
        if pending:
            raise ControlPlaneError(f"CRDs not established in time: {sorted(pending)}")
        self._wait_custom_storage(deadline)
        return names

    def _wait_custom_storage(self, deadline: float) -> None:
        """Fresh CRDs answer 'storage is (re)initializing' for a while: wait it out here."""
        transport = self.datastore().transport
        for kind in CRD_KINDS:
            while True:
                try:
                    transport.request("GET", kind.collection_path())
                    break
                except DatastoreError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)

    def _crd_established(self, name: str) -> bool:
        body = self.datastore().transport.request("GET", f"{CRD_PATH}/{name}")
        conditions = body.get("status", {}).get("conditions") or []
        return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)

    # -- admission ----------------------------------------------------------------------
    def install_admission(self, path: Path = ADMISSION) -> None:
        """Install the IPPool admission policies a cluster gets from manifests/.

        The apiserver loads policies and their params asynchronously: wait until they
        judge pools (wait_admission), so that callers meet them.
        """
        transport = self.datastore().transport
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                plural = ADMISSION_PLURALS[doc["kind"]]
                with contextlib.suppress(AlreadyExists):
                    transport.request("POST", f"{ADMISSION_API}/{plural}", body=doc)
        self.admission_installed = True
        self.wait_admission()

    def wait_admission(self) -> None:
        """Wait until the IPPool policies judge pools, not fail to configure themselves.

        A policy whose paramKind is a CRD cannot resolve it until the apiserver's
        discovery has caught up (up to 30 s after a start; kubernetes#124237), and
        meanwhile denies every IPPool create with "failed to configure policy". Ready
        means: a pool over the Service range is denied and a clean pool is admitted.
        """
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not (
            self._admission_verdict(ADMISSION_PROBE_CLEAN) == "admitted"
            and self._admission_verdict(SERVICE_CIDR) == "denied"
        ):
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"admission policies of {ADMISSION.name} not in force")
            time.sleep(0.2)

    def _admission_verdict(self, cidr: str) -> str:
        """A dry-run IPPool create of cidr: 'admitted', 'denied' or 'unready'."""
        probe = {
            "apiVersion": "crd.tabby.dev/v1",
            "kind": "IPPool",
            "metadata": {"name": "tabby-admission-probe"},
            "spec": {"cidr": cidr},
        }
        try:
            self.datastore().transport.request(
                "POST", IPPOOL.collection_path(), query={"dryRun": "All"}, body=probe
            )
        except Invalid as exc:
            return "unready" if "failed to configure" in str(exc) else "denied"
        except (Unavailable, NotFound):
            return "unready"  # custom storage still initialising
        return "admitted"

    # -- relay for lab node namespaces --------------------------------------------------
    # Every relayed TCP leg sets TCP_NODELAY: socat forwards a client's request in the
    # pieces it reads (headers, then body); with Nagle on, the second piece waits for
    # the apiserver's delayed ACK, 40 ms, on about one request in four.
    def expose_unix_socket(self) -> Path:
        """A unix socket in the work dir that relays to the apiserver's loopback port.

        Network namespaces share the filesystem, so a relay inside a node namespace
        can reach the apiserver through this socket without any host routing.
        """
        path = self.workdir / "apiserver.sock"
        if self.relay is None or not self.relay.alive():
            path.unlink(missing_ok=True)
            target = (
                f"TCP:{self.address}:{LAB_APISERVER_PORT},{NODELAY}"
                if self.netns
                else f"TCP:127.0.0.1:{self.apiserver_port},{NODELAY}"
            )
            self.relay = self._launch(
                "apiserver-relay", ["socat", f"UNIX-LISTEN:{path},fork,mode=600", target]
            )
            self._wait(self.relay, path.exists, "apiserver relay")
        return path

    def _relay_to_host(self) -> None:
        """The host's 127.0.0.1:apiserver_port -> the unix socket -> the apiserver's netns."""
        sock = self.workdir / "apiserver.sock"
        listen = f"TCP-LISTEN:{self.apiserver_port},bind=127.0.0.1,reuseaddr,fork,{NODELAY}"
        self.host_relay = self._launch(
            "apiserver-host-relay", ["socat", listen, f"UNIX-CONNECT:{sock}"], host=True
        )

    # -- scheduler and controller manager (real-node lab) -------------------------------
    def start_controllers(self) -> None:
        """kube-scheduler and kube-controller-manager, as on a kubeadm control plane."""
        kubeconfig = str(self.lab_kubeconfig)
        common = [
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            "--v=1",
        ]
        self.scheduler = self._launch(
            "kube-scheduler", [str(self.bin_dir / "kube-scheduler"), *common]
        )
        pki = self.pki
        self.controller_manager = self._launch(
            "kube-controller-manager",
            [
                str(self.bin_dir / "kube-controller-manager"),
                *common,
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--root-ca-file={pki / 'ca.crt'}",
                f"--cluster-signing-cert-file={pki / 'ca.crt'}",
                f"--cluster-signing-key-file={pki / 'ca.key'}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                f"--flex-volume-plugin-dir={self.workdir / 'flexvolume'}",
                # Node lifecycle at lab speed: a stopped kubelet is NotReady in 20 s.
                "--node-monitor-grace-period=20s",
            ],
        )

    # -- helpers ------------------------------------------------------------------------
    def _launch(self, name: str, argv: list[str], *, host: bool = False) -> ManagedProcess:
        netns = None if host else self.netns
        log_path = self.workdir / f"{name}.log"
        proc = ManagedProcess(name, argv, log_path, netns=netns, keep_mounts=True).start()
        self.pids.record(proc)
        return proc

    def _wait(self, proc: ManagedProcess, ready: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if not proc.alive():
                raise ControlPlaneError(f"{what} exited during start-up:\n{proc.log_tail()}")
            if ready():
                return
            time.sleep(0.2)
        raise ControlPlaneError(
            f"{what} not ready after {READY_TIMEOUT_S:.0f}s:\n{proc.log_tail()}"
        )
