"""The static forwarder (cni/forwarder, Go) and the agent agree on the contract.

- the versions it answers VERSION with are the shim's (the agent's);
- its own tests pass (`go test`: settings found at any depth, an absent agent is
  code 11 but DEL succeeds, answers decoded as the shim decodes them);
- the agent takes its message form: a call forwarded unexamined is validated by the
  agent as the shim validated it, and refused with the same code and message.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from cni import shim
from felix.cni_server.request import forwarded_stdin, parse_request

FORWARDER = Path(__file__).resolve().parents[3] / "cni" / "forwarder"


def test_the_forwarder_answers_version_with_the_agents_versions() -> None:
    source = (FORWARDER / "main.go").read_text()
    [listed] = re.findall(r"var supportedVersions = \[\]string\{(.*)\}", source)
    assert tuple(json.loads(f"[{listed}]")) == shim.SUPPORTED_VERSIONS
    assert f"defaultSocket  = {json.dumps(shim.DEFAULT_SOCKET)}" in source
    assert f"maxMessage     = {shim.MAX_MESSAGE // (1024 * 1024)} * 1024 * 1024" in source


def test_the_forwarders_own_tests_pass() -> None:
    run = subprocess.run(
        ["go", "test", "./..."],
        cwd=FORWARDER,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "CGO_ENABLED": "0", "GOTOOLCHAIN": "local", "GOFLAGS": ""},
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr


ENV = {
    "CNI_COMMAND": "ADD",
    "CNI_CONTAINERID": "c0ffee",
    "CNI_IFNAME": "eth0",
    "CNI_NETNS": "/proc/self/ns/net",
    "CNI_ARGS": "K8S_POD_NAMESPACE=default;K8S_POD_NAME=p",
    "CNI_PATH": "/opt/cni/bin",
}
CONFIG = {"cniVersion": "1.0.0", "name": "k8s-pod-network", "type": "tabby"}


def _forwarded(env: dict[str, str], stdin: bytes) -> dict[str, object]:
    """The message cni/forwarder sends for this call."""
    message: dict[str, object] = {"command": env.get("CNI_COMMAND", ""), "env": env}
    try:
        message["stdin"] = stdin.decode("utf-8")
    except UnicodeDecodeError:
        message["stdin_base64"] = base64.b64encode(stdin).decode()
    return message


def _shim_says(env: dict[str, str], stdin: bytes) -> tuple[int, str]:
    try:
        shim.build_request(env.get("CNI_COMMAND", ""), env, stdin)
    except shim.CNIError as exc:
        return exc.code, exc.msg
    return 0, ""


def _agent_says(env: dict[str, str], stdin: bytes) -> tuple[int, str]:
    try:
        parse_request(json.loads(json.dumps(_forwarded(env, stdin))))
    except shim.CNIError as exc:
        return exc.code, exc.msg
    return 0, ""


CASES = [
    (ENV, json.dumps(CONFIG).encode()),
    (ENV, b"not json"),
    (ENV, b"\xff\xfe"),
    (ENV, b'{"cniVersion": "1.0.0", "x": ' + b"[" * 5000 + b"]" * 5000 + b"}"),
    (ENV, json.dumps({**CONFIG, "cniVersion": "9.9.9"}).encode()),
    (ENV, json.dumps({**CONFIG, "mtu": 5}).encode()),
    (ENV, json.dumps({**CONFIG, "agent_socket": "relative"}).encode()),
    ({**ENV, "CNI_COMMAND": "BOGUS"}, json.dumps(CONFIG).encode()),
    ({**ENV, "CNI_CONTAINERID": "a" * 4096}, json.dumps(CONFIG).encode()),
    ({**ENV, "CNI_IFNAME": "a/b"}, json.dumps(CONFIG).encode()),
    ({**ENV, "CNI_NETNS": "/proc/self/ns/uts"}, json.dumps(CONFIG).encode()),
    ({k: v for k, v in ENV.items() if k != "CNI_NETNS"}, json.dumps(CONFIG).encode()),
    ({**ENV, "CNI_ARGS": "novalue"}, json.dumps(CONFIG).encode()),
    ({**ENV, "CNI_COMMAND": "GC"}, json.dumps({**CONFIG, "cniVersion": "1.1.0"}).encode()),
]


@pytest.mark.parametrize(("env", "stdin"), CASES)
def test_a_forwarded_call_is_judged_as_the_shim_judged_it(
    env: dict[str, str], stdin: bytes
) -> None:
    assert _agent_says(env, stdin) == _shim_says(env, stdin)


def test_the_forwarders_stdin_forms() -> None:
    assert forwarded_stdin({"stdin": "{}"}) == b"{}"
    assert forwarded_stdin({"stdin_base64": base64.b64encode(b"\xff").decode()}) == b"\xff"
    assert forwarded_stdin({"config": {}}) is None  # the shim's form
    with pytest.raises(shim.CNIError) as refused:
        forwarded_stdin({"stdin_base64": "not base64!"})
    assert refused.value.code == shim.ERR_DECODING


@pytest.mark.parametrize("encoded", ["\u00e4{", "\u00a1\u0004", "not base64!", ["a"], 7])
def test_a_stdin_base64_that_is_not_base64_is_a_decoding_error(encoded: object) -> None:
    """Found by the raw corpus: a non-ASCII `stdin_base64` was an internal error (999)."""
    with pytest.raises(shim.CNIError) as refused:
        forwarded_stdin({"command": "ADD", "env": {}, "stdin_base64": encoded})
    assert refused.value.code == shim.ERR_DECODING
    assert refused.value.msg == "stdin_base64 is not base64"
