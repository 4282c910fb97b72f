"""In-cluster configuration: which cluster is chosen, how the ServiceAccount mount is
read, and how a rotated or refused token is picked up again.

The ServiceAccount mount is a temporary directory laid out as kubelet writes it; the
401 cases talk to a small HTTP server in this process that accepts one token only.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from click.testing import CliRunner
from kubernetes import client as k8s_client

from controllers import main as gc_main
from datastore import incluster, kinds
from datastore.client import Datastore
from datastore.errors import NotConfigured, Unauthorized
from datastore.incluster import choose_kubeconfig, server_url
from datastore.transport import HttpTransport, TokenFile
from felix import agent
from tabbyctl.main import cli
from tests.unit.datastore.serviceaccount_mount import Mount

POD_ENV = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}


@pytest.fixture
def mount(tmp_path: Path) -> Mount:
    return Mount(tmp_path / "serviceaccount")


def authorization(transport: HttpTransport) -> str | None:
    return transport._auth_headers().get("Authorization")


# -- which cluster ------------------------------------------------------------------------------


def test_selection_order_flag_then_env_then_home_then_in_cluster(
    tmp_path: Path, mount: Mount
) -> None:
    home = tmp_path / "home-config"
    home.write_text("{}")
    env = {**POD_ENV, "KUBECONFIG": "/from/env"}
    choose = choose_kubeconfig
    assert choose("/from/flag", env, home_default=str(home), directory=mount.root) == "/from/flag"
    assert choose(None, env, home_default=str(home), directory=mount.root) == "/from/env"
    assert choose(None, {**env, "KUBECONFIG": ""}, home_default=str(home)) == str(home)
    assert choose(None, POD_ENV, home_default=str(tmp_path / "none"), directory=mount.root) is None
    assert choose(None, POD_ENV, directory=mount.root) is None


def test_kubeconfig_list_takes_the_first_file_that_exists(tmp_path: Path) -> None:
    second = tmp_path / "second"
    second.write_text("{}")
    listed = os.pathsep.join([str(tmp_path / "missing"), str(second)])
    assert choose_kubeconfig(None, {"KUBECONFIG": listed}) == str(second)


@pytest.mark.parametrize(
    ("drop", "named"),
    [
        ("KUBERNETES_SERVICE_HOST", "$KUBERNETES_SERVICE_HOST is not set"),
        ("KUBERNETES_SERVICE_PORT", "$KUBERNETES_SERVICE_PORT is not set"),
        ("token", "token does not exist"),
        ("ca.crt", "ca.crt does not exist"),
    ],
)
def test_a_missing_piece_is_named(mount: Mount, drop: str, named: str) -> None:
    env = {k: v for k, v in POD_ENV.items() if k != drop}
    if drop in ("token", "ca.crt"):
        (mount.root / drop).unlink()
    with pytest.raises(NotConfigured) as chosen:
        choose_kubeconfig(None, env, directory=mount.root)
    message = str(chosen.value)
    assert "no kubeconfig and not in a cluster" in message
    assert "--kubeconfig not given, $KUBECONFIG not set" in message
    assert named in message
    with pytest.raises(NotConfigured, match=named.replace("$", r"\$")):
        HttpTransport.in_cluster(mount.root, env)


def test_outside_a_pod_the_default_mount_path_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(NotConfigured) as chosen:
        choose_kubeconfig(None, {}, home_default="/nonexistent/.kube/config")
    message = str(chosen.value)
    assert "/nonexistent/.kube/config not found" in message
    assert "/var/run/secrets/kubernetes.io/serviceaccount/token does not exist" in message


# -- the three programs -------------------------------------------------------------------------


@pytest.fixture
def outside_a_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("KUBECONFIG", *POD_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config either
    monkeypatch.setattr(incluster, "SERVICE_ACCOUNT_DIR", tmp_path / "no-mount")


@pytest.mark.usefixtures("outside_a_cluster")
def test_agent_and_controllers_exit_2_naming_what_was_looked_for(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for parse in (lambda: agent.parse_args(["--node-name=n"]), lambda: gc_main.parse_args([])):
        with pytest.raises(SystemExit) as exited:
            parse()
        assert exited.value.code == 2
        err = capsys.readouterr().err
        assert "no kubeconfig and not in a cluster" in err
        assert "no-mount/token does not exist" in err


def test_tabbyctl_exits_2_naming_what_was_looked_for(
    outside_a_cluster: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("tabbyctl.main.DEFAULT_KUBECONFIG", "/nonexistent/.kube/config")
    result = CliRunner().invoke(cli, ["ipam", "show"])
    assert result.exit_code == 2, result.output
    assert "no kubeconfig and not in a cluster" in result.output
    assert "/nonexistent/.kube/config not found" in result.output


def test_programs_in_a_pod_go_in_cluster_and_a_flag_still_wins(
    mount: Mount, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(incluster, "SERVICE_ACCOUNT_DIR", mount.root)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    for name, value in POD_ENV.items():
        monkeypatch.setenv(name, value)
    assert agent.parse_args(["--node-name=n"]).kubeconfig is None
    assert gc_main.parse_args([]).kubeconfig is None
    monkeypatch.setenv("KUBECONFIG", "/env/kubeconfig")
    assert agent.parse_args(["--node-name=n"]).kubeconfig == "/env/kubeconfig"
    assert gc_main.parse_args(["--kubeconfig=/flag"]).kubeconfig == "/flag"


# -- the transport ------------------------------------------------------------------------------


def test_in_cluster_transport_uses_the_mount(mount: Mount) -> None:
    transport = HttpTransport.in_cluster(mount.root, POD_ENV)
    assert transport.host == "https://10.96.0.1:443"
    assert authorization(transport) == "Bearer first-token"
    assert transport._pool.connection_pool_kw["ca_certs"] == str(mount.root / "ca.crt")
    assert transport._pool.connection_pool_kw["cert_reqs"] == "CERT_REQUIRED"


@pytest.mark.parametrize(
    ("host", "url"),
    [
        ("fd00:10:96::1", "https://[fd00:10:96::1]:443"),
        ("[fd00::1]", "https://[fd00::1]:443"),
        ("10.96.0.1", "https://10.96.0.1:443"),
    ],
)
def test_ipv6_service_host_is_bracketed(mount: Mount, host: str, url: str) -> None:
    assert server_url(host, "443") == url
    env = {**POD_ENV, "KUBERNETES_SERVICE_HOST": host}
    assert HttpTransport.in_cluster(mount.root, env).host == url


def test_rotated_token_is_sent_at_the_next_request(mount: Mount) -> None:
    transport = HttpTransport.in_cluster(mount.root, POD_ENV)
    assert authorization(transport) == "Bearer first-token"
    mount.write("second-token")
    assert authorization(transport) == "Bearer second-token"


def test_token_is_reread_after_max_age_even_if_the_file_looks_unchanged(tmp_path: Path) -> None:
    """A file rewritten in place with the same size and mtime (a stat cannot tell) is
    read again once the last read is max_age_s old, as client-go does each minute."""
    path = tmp_path / "token"
    path.write_text("aaaa")
    now = [1000.0]
    token = TokenFile(path, max_age_s=60.0, clock=lambda: now[0])
    assert token() == "Bearer aaaa"
    st = path.stat()
    with path.open("r+") as f:
        f.write("bbbb")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    now[0] += 59.0
    assert token() == "Bearer aaaa"
    now[0] += 1.0
    assert token() == "Bearer bbbb"


def test_a_vanished_token_file_keeps_the_last_token(mount: Mount) -> None:
    transport = HttpTransport.in_cluster(mount.root, POD_ENV)
    assert authorization(transport) == "Bearer first-token"
    (mount.root / "token").unlink()
    assert authorization(transport) == "Bearer first-token"


class OneToken(BaseHTTPRequestHandler):
    """An apiserver that accepts one bearer token (server.accepted) and nothing else."""

    server: TokenServer

    def do_GET(self) -> None:
        self.server.seen.append(self.headers.get("Authorization", ""))
        if self.headers.get("Authorization") != f"Bearer {self.server.accepted}":
            self._send(401, {"kind": "Status", "reason": "Unauthorized", "message": "Unauthorized"})
        elif "watch=true" in self.path:
            self._send(200, {"type": "ADDED", "object": {"metadata": {"name": "n1"}}})
        else:
            self._send(200, {"items": [{"metadata": {"name": "n1"}}], "metadata": {}})

    def _send(self, status: int, body: dict[str, object]) -> None:
        data = json.dumps(body).encode() + b"\n"
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


class TokenServer(ThreadingHTTPServer):
    accepted = ""
    seen: list[str]


@pytest.fixture
def server() -> Iterator[TokenServer]:
    httpd = TokenServer(("127.0.0.1", 0), OneToken)
    httpd.seen = []
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield httpd
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


def _transport(server: TokenServer, token_path: Path) -> HttpTransport:
    configuration = k8s_client.Configuration()
    configuration.host = f"http://127.0.0.1:{server.server_address[1]}"
    return HttpTransport(configuration, TokenFile(token_path))


def _rewrite_unnoticed(path: Path, token: str) -> None:
    """Replace the token in place, same size and mtime: only a re-read can see it."""
    st = path.stat()
    path.write_text(token)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_401_rereads_the_token_and_retries_once(server: TokenServer, tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("old-token")
    ds = Datastore(_transport(server, path))
    server.accepted = "old-token"
    assert [n["metadata"]["name"] for n in ds.list_raw(kinds.NODE)[0]] == ["n1"]
    server.accepted = "new-token"  # the old one was revoked
    _rewrite_unnoticed(path, "new-token")
    items, _ = ds.list_raw(kinds.NODE)
    assert [n["metadata"]["name"] for n in items] == ["n1"]
    assert server.seen == ["Bearer old-token", "Bearer old-token", "Bearer new-token"]


def test_401_with_an_unchanged_token_is_unauthorized_once(
    server: TokenServer, tmp_path: Path
) -> None:
    path = tmp_path / "token"
    path.write_text("revoked")
    server.accepted = "something-else"
    ds = Datastore(_transport(server, path))
    with pytest.raises(Unauthorized) as refused:
        ds.list_raw(kinds.NODE)
    assert refused.value.status == 401
    assert server.seen == ["Bearer revoked"]  # no retry: nothing changed


def test_watch_retries_with_a_rotated_token(server: TokenServer, tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("old-token")
    transport = _transport(server, path)
    assert authorization(transport) == "Bearer old-token"
    server.accepted = "new-token"
    _rewrite_unnoticed(path, "new-token")
    events = list(transport.watch("/api/v1/nodes", {}, timeout=5))
    assert [e["type"] for e in events] == ["ADDED"]
    assert server.seen == ["Bearer old-token", "Bearer new-token"]
