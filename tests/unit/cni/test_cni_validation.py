"""The shim answers every malformed call with spec error JSON and the right code."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cni import install, shim

SHIM = Path(shim.__file__)
NETNS = "/proc/self/ns/net"  # exists everywhere; the shim only checks the path


def conf(**over: object) -> bytes:
    base: dict[str, object] = {
        "cniVersion": "1.0.0",
        "name": "k8s-pod-network",
        "type": "tabby",
        "agent_socket": "/nonexistent/tabby-test/cni.sock",
    }
    base.update(over)
    return json.dumps({k: v for k, v in base.items() if v is not None}).encode()


def env(**over: str | None) -> dict[str, str]:
    base: dict[str, str | None] = {
        "CNI_COMMAND": "ADD",
        "CNI_CONTAINERID": "abc123",
        "CNI_NETNS": NETNS,
        "CNI_IFNAME": "eth0",
        "CNI_ARGS": "K8S_POD_NAMESPACE=default;K8S_POD_NAME=nginx",
        "CNI_PATH": "/opt/cni/bin",
    }
    base.update(over)
    return {k: v for k, v in base.items() if v is not None}


E = shim
CORPUS: list[tuple[str, dict[str, str], bytes, int]] = [
    ("bad json", env(), b"{not json", E.ERR_DECODING),
    ("empty stdin", env(), b"", E.ERR_DECODING),
    ("json array", env(), b"[1, 2]", E.ERR_DECODING),
    ("json string", env(), b'"hello"', E.ERR_DECODING),
    ("invalid utf-8", env(), b"\xff\xfe{}", E.ERR_DECODING),
    ("missing cniVersion", env(), conf(cniVersion=None), E.ERR_INVALID_CONFIG),
    ("cniVersion not a string", env(), conf(cniVersion=1.0), E.ERR_INVALID_CONFIG),
    ("cniVersion 0.2.0", env(), conf(cniVersion="0.2.0"), E.ERR_INCOMPATIBLE_VERSION),
    ("cniVersion 2.0.0", env(), conf(cniVersion="2.0.0"), E.ERR_INCOMPATIBLE_VERSION),
    ("cniVersion garbage", env(), conf(cniVersion="latest"), E.ERR_INCOMPATIBLE_VERSION),
    ("missing name", env(), conf(name=None), E.ERR_INVALID_CONFIG),
    ("name with slash", env(), conf(name="a/b"), E.ERR_INVALID_CONFIG),
    ("name not a string", env(), conf(name=7), E.ERR_INVALID_CONFIG),
    ("missing type", env(), conf(type=None), E.ERR_INVALID_CONFIG),
    ("type not a string", env(), conf(type=["tabby"]), E.ERR_INVALID_CONFIG),
    ("mtu string", env(), conf(mtu="1500"), E.ERR_INVALID_CONFIG),
    ("mtu bool", env(), conf(mtu=True), E.ERR_INVALID_CONFIG),
    ("mtu too small", env(), conf(mtu=20), E.ERR_INVALID_CONFIG),
    ("mtu float", env(), conf(mtu=1500.0), E.ERR_INVALID_CONFIG),
    ("agent timeout zero", env(), conf(agent_timeout_s=0), E.ERR_INVALID_CONFIG),
    ("agent timeout string", env(), conf(agent_timeout_s="5"), E.ERR_INVALID_CONFIG),
    ("prevResult not object", env(), conf(prevResult="x"), E.ERR_INVALID_CONFIG),
    ("agent_socket relative", env(), conf(agent_socket="run/cni.sock"), E.ERR_INVALID_CONFIG),
    ("missing command", env(CNI_COMMAND=None), conf(), E.ERR_INVALID_ENV),
    ("unknown command", env(CNI_COMMAND="UPDATE"), conf(), E.ERR_INVALID_ENV),
    ("lowercase command", env(CNI_COMMAND="add"), conf(), E.ERR_INVALID_ENV),
    ("missing container id", env(CNI_CONTAINERID=None), conf(), E.ERR_INVALID_ENV),
    ("bad container id", env(CNI_CONTAINERID="-abc"), conf(), E.ERR_INVALID_ENV),
    ("container id space", env(CNI_CONTAINERID="ab c"), conf(), E.ERR_INVALID_ENV),
    ("missing ifname", env(CNI_IFNAME=None), conf(), E.ERR_INVALID_ENV),
    ("ifname too long", env(CNI_IFNAME="eth0123456789abc"), conf(), E.ERR_INVALID_ENV),
    ("ifname slash", env(CNI_IFNAME="eth/0"), conf(), E.ERR_INVALID_ENV),
    ("ifname colon", env(CNI_IFNAME="eth0:1"), conf(), E.ERR_INVALID_ENV),
    ("ifname space", env(CNI_IFNAME="eth 0"), conf(), E.ERR_INVALID_ENV),
    ("ifname dot", env(CNI_IFNAME="."), conf(), E.ERR_INVALID_ENV),
    ("ifname dotdot", env(CNI_IFNAME=".."), conf(), E.ERR_INVALID_ENV),
    ("ADD without netns", env(CNI_NETNS=None), conf(), E.ERR_INVALID_ENV),
    ("CHECK without netns", env(CNI_COMMAND="CHECK", CNI_NETNS=None), conf(), E.ERR_INVALID_ENV),
    ("relative netns", env(CNI_NETNS="var/run/netns/x"), conf(), E.ERR_INVALID_ENV),
    ("netns missing", env(CNI_NETNS="/var/run/netns/tbt-none"), conf(), E.ERR_UNKNOWN_CONTAINER),
    ("DEL relative netns", env(CNI_COMMAND="DEL", CNI_NETNS="x/y"), conf(), E.ERR_INVALID_ENV),
    ("CNI_ARGS no equals", env(CNI_ARGS="K8S_POD_NAME"), conf(), E.ERR_INVALID_ENV),
    ("CNI_ARGS empty key", env(CNI_ARGS="=x"), conf(), E.ERR_INVALID_ENV),
    (
        "GC without CNI_PATH",
        env(CNI_COMMAND="GC", CNI_PATH=None),
        conf(cniVersion="1.1.0", **{"cni.dev/attachments": []}),
        E.ERR_INVALID_ENV,
    ),
    ("GC without attachments", env(CNI_COMMAND="GC"), conf(cniVersion="1.1.0"), 7),
    ("GC on 1.0.0", env(CNI_COMMAND="GC"), conf(), E.ERR_INCOMPATIBLE_VERSION),
    ("STATUS on 0.4.0", env(CNI_COMMAND="STATUS"), conf(cniVersion="0.4.0"), 1),
    (
        "attachments not list",
        env(CNI_COMMAND="GC"),
        conf(cniVersion="1.1.0", **{"cni.dev/attachments": {}}),
        E.ERR_INVALID_CONFIG,
    ),
    (
        "attachment entry bad",
        env(CNI_COMMAND="GC"),
        conf(cniVersion="1.1.0", **{"cni.dev/attachments": [{"containerID": 1, "ifname": "eth0"}]}),
        E.ERR_INVALID_CONFIG,
    ),
    ("agent down ADD", env(), conf(), E.ERR_TRY_AGAIN_LATER),
    ("agent down CHECK", env(CNI_COMMAND="CHECK"), conf(), E.ERR_TRY_AGAIN_LATER),
    ("agent down STATUS", env(CNI_COMMAND="STATUS"), conf(cniVersion="1.1.0"), 11),
]


@pytest.mark.parametrize(("case", "environ", "stdin", "code"), CORPUS, ids=[c[0] for c in CORPUS])
def test_malformed_call_gets_spec_error(
    case: str, environ: dict[str, str], stdin: bytes, code: int
) -> None:
    rc, out = shim.run(environ, stdin)
    answer = json.loads(out)
    assert rc != 0, case
    assert set(answer) == {"cniVersion", "code", "msg", "details"}
    assert answer["code"] == code, answer
    assert answer["msg"]
    assert answer["cniVersion"] in shim.SUPPORTED_VERSIONS


def test_corpus_is_large_enough() -> None:
    assert len(CORPUS) >= 30


def test_agent_down_message_names_the_socket() -> None:
    rc, out = shim.run(env(), conf(agent_socket="/nonexistent/x/agent.sock"))
    answer = json.loads(out)
    assert (rc, answer["code"]) == (1, 11)
    assert "/nonexistent/x/agent.sock" in answer["msg"]


def test_error_uses_the_callers_version() -> None:
    _, out = shim.run(env(CNI_IFNAME="a/b"), conf(cniVersion="0.4.0"))
    assert json.loads(out)["cniVersion"] == "0.4.0"


def test_del_succeeds_when_agent_is_down() -> None:
    rc, out = shim.run(env(CNI_COMMAND="DEL", CNI_NETNS=None), conf())
    assert (rc, out) == (0, "")


def test_del_accepts_missing_netns_path() -> None:
    """DEL may name a netns that is already gone; only ADD/CHECK need it to exist."""
    request = shim.build_request("DEL", env(CNI_COMMAND="DEL", CNI_NETNS="/run/netns/gone"), conf())
    assert request["env"]["CNI_NETNS"] == "/run/netns/gone"


def test_version_is_answered_locally() -> None:
    rc, out = shim.run({"CNI_COMMAND": "VERSION"}, conf(cniVersion="0.4.0"))
    answer = json.loads(out)
    assert rc == 0
    assert answer == {"cniVersion": "0.4.0", "supportedVersions": list(shim.SUPPORTED_VERSIONS)}


def test_version_tolerates_garbage_stdin() -> None:
    rc, out = shim.run({"CNI_COMMAND": "VERSION"}, b"garbage")
    assert rc == 0
    assert json.loads(out)["cniVersion"] == "1.1.0"


def test_request_carries_env_subset_args_and_config() -> None:
    request = shim.build_request("ADD", env(OTHER="secret"), conf(mtu=1400))
    assert request["command"] == "ADD"
    assert "OTHER" not in request["env"]
    assert request["env"]["CNI_IFNAME"] == "eth0"
    assert request["args"] == {"K8S_POD_NAMESPACE": "default", "K8S_POD_NAME": "nginx"}
    assert request["config"]["mtu"] == 1400


def test_shim_imports_only_the_standard_library() -> None:
    """-I -S: no site-packages, so any third-party import would fail here."""
    out = subprocess.run(
        [sys.executable, "-I", "-S", str(SHIM)],
        capture_output=True,
        text=True,
        check=False,
        env={"CNI_COMMAND": "VERSION"},
        input="",
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["supportedVersions"]


def test_shim_imports_are_the_minimal_set() -> None:
    tree = ast.parse(SHIM.read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    # the C cores of json and socket; `json` itself only on the decode-error path,
    # `fcntl` (built in, ~50 us) only when ADD/CHECK check that CNI_NETNS is a netns
    assert imported == {"_json", "_socket", "fcntl", "json", "os", "sys"}
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]


@pytest.mark.parametrize("command", ["VERSION", "ADD"])
def test_startup_imports_only_c_cores(command: str) -> None:
    """-X importtime lists every module the real run imports (ADD: agent down)."""
    proc = subprocess.run(
        [sys.executable, "-I", "-S", "-X", "importtime", str(SHIM)],
        input=conf(),
        env=env(CNI_COMMAND=command),
        capture_output=True,
        check=False,
        timeout=30,
    )
    assert proc.stdout  # a version answer or a code-11 error
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.decode().splitlines()}
    assert {"_json", "_socket"} <= imported
    # json and socket pull in re and enum (~20 ms per call): a normal run avoids them
    assert not imported & {
        "json",
        "socket",
        "re",
        "enum",
        "http",
        "urllib",
        "logging",
        "typing",
        "subprocess",
    }


def test_subprocess_error_goes_to_stdout_with_nonzero_exit() -> None:
    proc = subprocess.run(
        [sys.executable, "-I", "-S", str(SHIM)],
        input=b"{broken",
        capture_output=True,
        env={**env(), "PATH": os.environ.get("PATH", "")},
        check=False,
        timeout=30,
    )
    assert proc.returncode == 1
    assert json.loads(proc.stdout)["code"] == shim.ERR_DECODING


def test_installed_copy_runs_by_its_shebang(tmp_path: Path) -> None:
    """Runtimes exec the plugin file itself: the shebang must run it with -I -S."""
    if not os.path.exists("/usr/bin/python3"):
        pytest.skip("the installed launcher names /usr/bin/python3, which this machine lacks")
    plugin = install.install_shim(tmp_path, "/usr/bin/python3")
    proc = subprocess.run(
        [str(plugin)],
        input=b"{}",
        env={"CNI_COMMAND": "VERSION"},
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "1.1.0" in json.loads(proc.stdout)["supportedVersions"]
    assert plugin.read_text().splitlines()[0] == "#!/usr/bin/python3 -IS"
    assert SHIM.read_text().splitlines()[0] == "#!/usr/bin/python3 -IS"
    # the shim runs from bytecode compiled at install, not from source on every call
    assert list((tmp_path / "tabby.d" / "__pycache__").glob("tabby_shim.*.pyc"))
