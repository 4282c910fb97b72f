"""CNI error codes as a runtime reads them (issue 21 item 8).

The plugin is the static forwarder (``cni/forwarder``, what nodes run) or, as the
reference it keeps the rules of, the Python shim installed with
:func:`cni.install.install_shim`; each is run as a runtime runs it: its path
executed inside the node namespace, with the CNI_* environment and the network
config on stdin. The agent is the real one
(``python -m felix.cni_server`` in a node namespace this test owns); the
"killed mid-answer" cases add a fake agent that accepts, reads and hangs up.

What a runtime does with a code: 11 means try again later; every other code
is permanent. So an agent that died mid-ADD must be 11, and input that will
never work (too large, too long, not a namespace, undecodable) must not be.
Every failure must print spec error JSON on stdout, never a traceback.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from cni.install import install_shim
from cni.shim import MAX_MESSAGE
from lab import netns

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
POOL = "10.66.0.0/24"
TRY_AGAIN_LATER = 11


@dataclass
class Answer:
    """What the runtime sees: exit status, stdout decoded, stderr."""

    rc: int
    out: Any
    stderr: str

    @property
    def code(self) -> int | None:
        return self.out.get("code") if isinstance(self.out, dict) else None


@dataclass
class Node:
    """A node namespace with the installed plugin, a real agent and one pod netns."""

    name: str
    plugin: Path
    sock: str
    pod: str
    log: Path
    agent: subprocess.Popen[bytes] | None = None
    pods: list[str] = field(default_factory=list)

    def new_pod(self) -> str:
        """Another sandbox netns (deleted with the node)."""
        pod = f"{self.pod}{len(self.pods)}"
        netns.add(pod)
        self.pods.append(pod)
        return pod

    def start_agent(self) -> None:
        cmd = ["ip", "netns", "exec", self.name, sys.executable, "-m", "felix.cni_server"]
        cmd += ["--socket", self.sock, "--pool", POOL]
        with self.log.open("ab") as out:
            # Its own process group: a SIGKILL to the group takes any helper with it.
            self.agent = subprocess.Popen(
                cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + 30
        while not os.path.exists(self.sock):
            assert self.agent.poll() is None, self.log.read_text()
            assert time.monotonic() < deadline, "agent did not open its socket"
            time.sleep(0.02)

    def kill_agent(self) -> None:
        """SIGKILL, as the OOM killer or `kill -9` does (by the group we started)."""
        if self.agent is not None and self.agent.poll() is None:
            os.killpg(self.agent.pid, signal.SIGKILL)
            self.agent.wait(timeout=10)
        self.agent = None
        if os.path.exists(self.sock):
            os.unlink(self.sock)

    def stop_agent(self) -> None:
        if self.agent is not None and self.agent.poll() is None:
            self.agent.terminate()
            try:
                self.agent.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill_agent()
        self.agent = None

    def env(self, command: str = "ADD", pod: str = "", **overrides: str) -> dict[str, str]:
        cid = secrets.token_hex(8)
        env = {
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "CNI_COMMAND": command,
            "CNI_CONTAINERID": f"c{cid}",
            "CNI_IFNAME": "eth0",
            "CNI_NETNS": f"/var/run/netns/{pod or self.pod}",
            "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=p{cid}",
            "CNI_PATH": "/usr/lib/cni",
        }
        env.update(overrides)
        return env

    def config(self, **extra: Any) -> dict[str, Any]:
        conf = {"cniVersion": "1.0.0", "name": "k8s-pod-network", "type": "tabby"}
        conf.update({"agent_socket": self.sock, "agent_timeout_s": 20, **extra})
        return conf

    def start(self, env: dict[str, str], stdin: bytes) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            ["ip", "netns", "exec", self.name, str(self.plugin)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

    def finish(self, proc: subprocess.Popen[bytes], stdin: bytes) -> Answer:
        out, err = proc.communicate(stdin, timeout=60)
        text = out.decode().strip()
        try:
            decoded = json.loads(text) if text else None
        except ValueError:
            decoded = text
        return Answer(proc.returncode, decoded, err.decode())

    def call(self, env: dict[str, str], stdin: bytes | dict[str, Any]) -> Answer:
        raw = json.dumps(stdin).encode() if isinstance(stdin, dict) else stdin
        return self.finish(self.start(env, raw), raw)


def forwarder_binary() -> Path:
    """The static forwarder (cni/forwarder), built by hack/build-cni.sh if missing."""
    built = subprocess.run(
        [str(REPO / "hack" / "build-cni.sh")], capture_output=True, text=True, check=True
    )
    return Path(built.stdout.strip())


@pytest.fixture(params=["forwarder", "shim"])
def node(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Node]:
    """A node whose plugin is the static forwarder (what nodes run) or the Python shim
    (the reference the forwarder keeps the rules of): every test runs against both."""
    tag = secrets.token_hex(3)
    name, pod = f"tbt-{tag}-node", f"tbt-{tag}-pod"
    if request.param == "shim":
        plugin = install_shim(tmp_path / "bin", python=PYTHON)
    else:
        plugin = tmp_path / "bin" / "tabby"
        plugin.parent.mkdir()
        shutil.copy(forwarder_binary(), plugin)
    n = Node(name, plugin, str(tmp_path / "run" / "cni.sock"), pod, tmp_path / "agent.log")
    try:
        netns.add(name)
        netns.add(pod)
        # Proxy ARP needs a route out of another interface: an uplink stand-in.
        netns.ip(name, "link", "add", "uplink", "type", "veth", "peer", "name", "uplink-peer")
        netns.ip(name, "link", "set", "uplink", "up")
        netns.ip(name, "route", "add", "default", "dev", "uplink")
        n.start_agent()
        yield n
    finally:
        n.stop_agent()
        for sandbox in n.pods:
            netns.delete(sandbox)
        netns.delete(pod)
        netns.delete(name)


def assert_spec_error(answer: Answer, code: int, *words: str) -> None:
    """Exit 1, spec error JSON with *code*, a message naming *words*, no traceback."""
    assert answer.rc == 1, answer
    assert isinstance(answer.out, dict), answer
    assert set(answer.out) == {"cniVersion", "code", "msg", "details"}, answer
    assert answer.code == code, answer
    text = f"{answer.out['msg']} {answer.out['details']}"
    for word in words:
        assert word in text, answer
    assert "Traceback" not in answer.stderr, answer.stderr


# --- the agent goes away mid-ADD ------------------------------------------------------


def fake_agent(path: str, reply: bytes) -> Callable[[], None]:
    """Accept one call, read the whole request, send *reply* (maybe b"") and hang up.

    What the plugin sees when the agent is killed after reading the request: an
    end of stream with no answer or a cut-off one. Returns a join function.
    """
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            while conn.recv(65536):
                pass
            conn.sendall(reply)
        server.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()

    def join() -> None:
        thread.join(timeout=30)
        os.unlink(path)

    return join


@pytest.mark.parametrize("reply", [b"", b'{"result": {"cniVersion": "1.0.0", "ips": [{"addr'])
def test_agent_gone_mid_add_is_try_again_later(node: Node, tmp_path: Path, reply: bytes) -> None:
    sock = str(tmp_path / "fake.sock")
    join = fake_agent(sock, reply)
    answer = node.call(node.env(), node.config(agent_socket=sock))
    join()
    assert_spec_error(answer, TRY_AGAIN_LATER, sock, "without")


def test_real_agent_killed_mid_add_is_try_again_later(node: Node) -> None:
    """SIGKILL the real agent once it has taken the ADD (a new handler thread).

    The kill lands before the agent read the request (connection reset),
    mid-ADD (end of stream, no answer) or after it answered, depending on the
    delay; every outcome must be success or 11, and the mid-ADD one must occur.
    """
    outcomes = []
    for attempt in range(16):
        assert node.agent is not None
        tasks = Path(f"/proc/{node.agent.pid}/task")
        before = set(os.listdir(tasks))
        env, raw = node.env(pod=node.new_pod()), json.dumps(node.config()).encode()
        proc = node.start(env, raw)
        assert proc.stdin is not None
        proc.stdin.write(raw)
        proc.stdin.close()
        deadline = time.monotonic() + 10
        while not set(os.listdir(tasks)) - before and time.monotonic() < deadline:
            pass  # spin: the handler thread starts right after accept()
        time.sleep(attempt * 0.0005)
        node.kill_agent()
        proc.stdin = None
        answer = node.finish(proc, b"")
        outcomes.append(answer)
        assert answer.rc == 0 or answer.code == TRY_AGAIN_LATER, answer
        assert "Traceback" not in answer.stderr, answer.stderr
        node.start_agent()
        if "without answering" in str(answer.out):
            break
    assert "without answering" in str(outcomes[-1].out), outcomes


# --- permanent input errors ----------------------------------------------------------


def test_request_over_the_size_limit_is_permanent(node: Node) -> None:
    conf = node.config(padding="x" * (MAX_MESSAGE + 1024))
    answer = node.call(node.env(), conf)
    assert_spec_error(answer, 7, "too large", "16 MiB")


def test_container_id_of_4096_chars_is_permanent(node: Node) -> None:
    answer = node.call(node.env(CNI_CONTAINERID="a" * 4096), node.config())
    assert_spec_error(answer, 4, "CNI_CONTAINERID", "4096")
    assert len(answer.out["msg"]) + len(answer.out["details"]) < 400, answer  # not echoed


def test_longest_accepted_container_id_works(node: Node) -> None:
    from cni.shim import MAX_CONTAINER_ID

    cid = "b" * MAX_CONTAINER_ID
    answer = node.call(node.env(CNI_CONTAINERID=cid), node.config())
    assert answer.rc == 0, answer
    assert node.call(node.env("DEL", CNI_CONTAINERID=cid), node.config()).rc == 0


@pytest.mark.parametrize("kind", ["file", "directory", "fifo", "other namespace type"])
def test_netns_that_is_not_a_network_namespace(node: Node, tmp_path: Path, kind: str) -> None:
    path = tmp_path / "not-a-netns"
    if kind == "file":
        path.write_text("")
    elif kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)  # opening it would block the agent for ever
    else:
        path = Path("/proc/self/ns/uts")
    for command in ("ADD", "CHECK"):
        conf = node.config()
        if command == "CHECK":
            conf["prevResult"] = {"cniVersion": "1.0.0"}
        answer = node.call(node.env(command, CNI_NETNS=str(path)), conf)
        assert_spec_error(answer, 4, f"CNI_NETNS {path} is not a network namespace")


@pytest.mark.parametrize("command", ["ADD", "DEL", "CHECK", "VERSION"])
def test_json_nested_100000_deep_is_a_decoding_error(node: Node, command: str) -> None:
    # The agent's socket named first, as a conflist does: the forwarder finds it at any
    # depth and the agent refuses the rest (the shim refuses it before any call).
    sock = json.dumps(node.sock).encode()
    deep = b'{"cniVersion": "1.0.0", "agent_socket": ' + sock + b', "x": '
    deep += b"[" * 100_000 + b"]" * 100_000 + b"}"
    answer = node.call(node.env(command), deep)
    if command == "VERSION":  # VERSION answers without reading the config
        assert answer.rc == 0 and "supportedVersions" in answer.out, answer
        return
    assert_spec_error(answer, 6, "nested")


def test_valid_add_still_works(node: Node) -> None:
    """The checks above leave a real ADD/DEL through the installed plugin working."""
    env = node.env()
    answer = node.call(env, node.config())
    assert answer.rc == 0, answer
    assert answer.out["ips"][0]["address"].startswith("10.66.0.")
    assert node.call({**env, "CNI_COMMAND": "DEL"}, node.config()).rc == 0
