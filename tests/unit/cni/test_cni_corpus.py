"""Issue 20, bad input: a generated corpus of CNI calls, none of which changes state
unless it is a valid call, and none of which stops the agent answering.

Calls are built from a valid ADD by mutations (a variable dropped or replaced by
any text, path tricks and over-long values included; a config field dropped or given
any JSON value; unknown fields; the stdin cut short or replaced by bytes) and made
twice: through the static executable nodes run (``cni/forwarder``, a process per
call with exactly the call's environment: ``node_exec.py``) and through the Python
shim (``shim.run``, in process, the reference whose rules the executable keeps), to
a real CNI server and handlers (the kernel faked, a pool allocator, an ADD journal).
Both must give the same answer. Raw messages are also written straight to the
server's socket, as any local root process could, in every form it reads (the
forwarder's ``{command, env, stdin}`` included). Each call either:

- is rejected: spec error JSON with a code and a message, and the allocator's
  handles, the endpoint table, the journal and the (fake) kernel are as before; or
- is accepted: then it was a valid call, and an accepted ADD is undone by its DEL.

The counts are printed (``-s``) and recorded in docs/reliability.md.
"""

from __future__ import annotations

import json
import socket
import subprocess
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cni import shim
from cni.shim import ERR_INTERNAL
from felix import wiring
from felix.cni_server import AddJournal, CNIHandlers, CNIServer
from felix.pool_allocator import PoolAllocator
from tests.unit.cni.node_exec import NodeExec, as_environment, can_unshare
from tests.unit.cni.test_cni_server import FakeKernel

REPO = Path(__file__).resolve().parents[3]
Plugin = Callable[[dict[str, str], bytes], tuple[int, str]]

NETNS = "/proc/self/ns/net"  # a network namespace everywhere (the shim checks its type)
ENV_KEYS = ("CNI_COMMAND", "CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_ARGS", "CNI_PATH")
CONFIG_KEYS = ("cniVersion", "name", "type", "mtu", "agent_timeout_s", "prevResult", "ipam")
TRICKS = [
    "",
    " ",
    ".",
    "..",
    "../../etc/passwd",
    "/etc/shadow",
    "a/b",
    "a\\b",
    "\x00",
    "\n",
    "eth0\x00x",
    "-rf",
    "$(reboot)",
    "`id`",
    "x" * 300,
    "x" * 70_000,
    "ünïcødé",
    "\ud800",
    "K8S_POD_NAME=x;K8S_POD_NAME=y",
    "IgnoreUnknown=1;K8S_POD_NAMESPACE=../kube-system;K8S_POD_NAME=x",
]
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=40)
    | st.sampled_from(TRICKS),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=8,
)
TEXT = st.text(max_size=60) | st.sampled_from(TRICKS)


def valid_call(socket_path: str) -> tuple[dict[str, str], dict[str, Any]]:
    env = {
        "CNI_COMMAND": "ADD",
        "CNI_CONTAINERID": "c0ffee",
        "CNI_NETNS": NETNS,
        "CNI_IFNAME": "eth0",
        "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web",
        "CNI_PATH": "/opt/cni/bin",
    }
    config = {
        "cniVersion": "1.0.0",
        "name": "k8s-pod-network",
        "type": "tabby",
        "agent_socket": socket_path,
    }
    return env, config


@st.composite
def calls(draw: st.DrawFn, socket_path: str) -> tuple[dict[str, str], bytes, str]:
    """(environment, stdin, what was mutated)."""
    env, config = valid_call(socket_path)
    done: list[str] = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["env-drop", "env-set", "cfg-drop", "cfg-set", "cfg-add"]))
        if kind == "env-drop":
            env.pop(draw(st.sampled_from(ENV_KEYS)), None)
        elif kind == "env-set":
            key = draw(st.sampled_from(ENV_KEYS))
            env[key] = draw(TEXT | st.sampled_from(shim.COMMANDS))
        elif kind == "cfg-drop":
            config.pop(draw(st.sampled_from(CONFIG_KEYS)), None)
        elif kind == "cfg-set":
            config[draw(st.sampled_from(CONFIG_KEYS))] = draw(JSON_VALUES)
        else:
            config[draw(st.text(min_size=1, max_size=12))] = draw(JSON_VALUES)
        done.append(kind)
    stdin = json.dumps(config).encode()
    cut = draw(st.sampled_from(["whole", "whole", "whole", "truncated", "bytes"]))
    if cut == "truncated":
        stdin = stdin[: draw(st.integers(0, max(0, len(stdin) - 1)))]
    elif cut == "bytes":
        stdin = draw(st.binary(max_size=200))
    done.append(cut)
    return env, stdin, "+".join(done)


class World:
    """The agent's side of the corpus, and what "no state change" compares."""

    def __init__(self, tmp: Path, kernel: FakeKernel) -> None:
        self.allocator = PoolAllocator("10.66.0.0/24")
        self.journal_dir = tmp / "journal"
        self.handlers = CNIHandlers(self.allocator, journal=AddJournal(self.journal_dir))
        self.handlers.set_synced()
        self.kernel = kernel
        self.server = CNIServer(str(tmp / "run" / "cni.sock"), self.handlers)

    def state(self) -> tuple[Any, ...]:
        endpoints = sorted(
            (e.container_id, e.ifname, str(e.address)) for e in self.handlers.endpoints.all()
        )
        journal = sorted(p.name for p in self.journal_dir.iterdir())
        return sorted(self.allocator.handles()), endpoints, journal, sorted(self.kernel.wired)


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    kernel = FakeKernel()
    monkeypatch.setattr(wiring, "wire", kernel.wire)
    monkeypatch.setattr(wiring, "unwire", kernel.unwire)
    monkeypatch.setattr(wiring, "check", kernel.check)
    w = World(tmp_path, kernel)
    w.server.start()
    try:
        yield w
    finally:
        w.server.stop()
        w.handlers.close()


def _is_spec_error(answer: Any) -> bool:
    return (
        isinstance(answer, dict)
        and set(answer) == {"cniVersion", "code", "msg", "details"}
        and isinstance(answer["code"], int)
        and bool(answer["msg"])
    )


@pytest.fixture
def executable(world: World) -> Iterator[NodeExec]:
    """The static forwarder as hack/build-cni.sh builds it (make build), run on a
    stand-in node whose default agent socket is the world's server."""
    if not can_unshare():
        pytest.skip("running the executable as a node does needs root (a mount namespace)")
    built = subprocess.run(
        [str(REPO / "hack" / "build-cni.sh")], capture_output=True, text=True, check=True
    )
    node = NodeExec(Path(built.stdout.strip()), world.server.path)
    try:
        yield node
    finally:
        node.close()


def _outcome(world: World, clean: Any, plugin: Plugin, env: dict[str, str], stdin: bytes) -> str:
    """One call's verdict ("code N: msg" or "accepted COMMAND"), after checking that a
    refusal changed nothing and that an accepted ADD is undone by its DEL."""
    rc, out = plugin(env, stdin)
    answer: Any = json.loads(out) if out else None
    if rc != 0:
        assert _is_spec_error(answer), (env, stdin, out)
        assert world.state() == clean, (env, stdin, answer)
        return f"code {answer['code']}: {answer['msg']}"
    command = env.get("CNI_COMMAND")
    if command == "ADD":
        assert answer["ips"], answer
        undo, _ = plugin({**env, "CNI_COMMAND": "DEL"}, stdin)
        assert undo == 0
        assert world.handlers.teardowns.drain()
    assert world.state() == clean, (env, stdin, answer)
    return f"accepted {command}"


def test_generated_calls_are_refused_alike_by_the_executable_and_the_shim(
    world: World, executable: NodeExec
) -> None:
    counts: Counter[str] = Counter()
    clean = world.state()
    differences: list[str] = []

    def through_executable(env: dict[str, str], stdin: bytes) -> tuple[int, str]:
        environment = as_environment(env)
        assert environment is not None
        return executable.run(environment, stdin)

    @settings(
        max_examples=600,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(calls(world.server.path))
    def one(call: tuple[dict[str, str], bytes, str]) -> None:
        env, stdin, _ = call
        counts["tried"] += 1
        reference = _outcome(world, clean, shim.run, env, stdin)
        counts[reference.split(":")[0]] += 1
        counts["rejected" if reference.startswith("code") else "accepted"] += 1
        if as_environment(env) is None:
            counts["no process environment can hold (NUL, lone surrogate)"] += 1
            return
        counts["through the executable"] += 1
        verdict = _outcome(world, clean, through_executable, env, stdin)
        if verdict != reference:
            differences.append(f"{env!r} {stdin[:120]!r}: shim {reference!r}, exe {verdict!r}")

    one()
    assert not differences, "\n".join(differences[:20]) + f"\n({len(differences)} in all)"
    # the agent still serves a valid call after the corpus, through both
    env, config = valid_call(world.server.path)
    for plugin in (through_executable, shim.run):
        assert _outcome(world, clean, plugin, env, json.dumps(config).encode()) == "accepted ADD"
    print(f"\ncorpus: {dict(sorted(counts.items()))}")
    assert counts["tried"] >= 500 and counts["rejected"] > counts["accepted"] > 0
    assert counts["through the executable"] >= 0.9 * counts["tried"], counts


COMMAND = st.sampled_from([*shim.COMMANDS, "", "EXEC"]) | TEXT
# The forwarder's form: every CNI_* variable and the configuration as sent.
FORWARDED_ENV = st.dictionaries(
    st.sampled_from([*ENV_KEYS, "CNI_OTHER", "PATH"]) | st.text(max_size=8),
    TEXT | JSON_VALUES,
    max_size=7,
)
RAW = st.one_of(
    st.binary(max_size=300),
    JSON_VALUES.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries(
        {"command": COMMAND},
        optional={"env": JSON_VALUES, "config": JSON_VALUES, "args": JSON_VALUES},
    ).map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries(
        {"command": COMMAND, "env": FORWARDED_ENV | JSON_VALUES},
        optional={
            "stdin": TEXT | JSON_VALUES,
            "stdin_base64": TEXT | st.binary(max_size=200).map(lambda b: b.hex()),
        },
    ).map(lambda v: json.dumps(v).encode()),
)


def _raw_answer(path: str, data: bytes) -> Any:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(10)
        conn.connect(path)
        conn.sendall(data)
        conn.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := conn.recv(65536):
            chunks.append(chunk)
    return json.loads(b"".join(chunks)) if chunks else None


def test_raw_messages_on_the_socket_never_change_state_or_stop_the_server(
    world: World,
) -> None:
    counts: Counter[str] = Counter()
    clean = world.state()

    @settings(max_examples=600, deadline=None, database=None)
    @given(RAW)
    def one(data: bytes) -> None:
        counts["tried"] += 1
        answer = _raw_answer(world.server.path, data)
        assert isinstance(answer, dict) and set(answer) <= {"result", "error"}, answer
        if "error" in answer:
            error = answer["error"]
            assert isinstance(error["code"], int) and error["msg"], answer
            assert error["code"] != ERR_INTERNAL, (data, answer)  # bad input is not our fault
            counts["rejected"] += 1
            counts[f"code {error['code']}"] += 1
        else:
            counts["accepted"] += 1  # e.g. a DEL or GC of nothing: nothing to change
        assert world.state() == clean, (data, answer)

    one()
    deep = b"[" * 100_000 + b"]" * 100_000  # nesting the decoder must refuse, not crash on
    for data in (deep, b"{" + b'"a":' * 50_000 + b"1" + b"}" * 50_000):
        answer = _raw_answer(world.server.path, data)
        assert "error" in answer and world.state() == clean
        counts["tried"] += 1
        counts["rejected"] += 1
    env, config = valid_call(world.server.path)
    rc, _ = shim.run(env, json.dumps(config).encode())
    assert rc == 0
    print(f"\nraw socket corpus: {dict(sorted(counts.items()))}")
    assert counts["tried"] >= 600
