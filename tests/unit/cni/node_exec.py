"""Run the static CNI executable as a node's runtime runs it, many times, cheaply.

The executable finds the agent at the socket its configuration names and, when it
cannot read one (a truncated or garbled configuration), at the default
`/run/tabby/cni.sock`, where a node's agent listens. To give every call that same
agent, one helper process lives in a mount namespace of its own (private, so nothing
reaches the host's mounts) with a tmpfs on `/run` whose `tabby/cni.sock` links to the
test's server; it runs the executable once per call, with exactly the call's
environment (nothing inherited) and stdin, and reports its exit code and stdout.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import IO

DEFAULT_SOCKET = "/run/tabby/cni.sock"

# The helper, inside its mount namespace: set up /run, then one call per input line.
HELPER = r"""
import base64, json, os, subprocess, sys
binary, server = sys.argv[1], sys.argv[2]
subprocess.run(["mount", "-t", "tmpfs", "tabby-corpus", "/run"], check=True)
os.makedirs("/run/tabby")
os.symlink(server, "/run/tabby/cni.sock")
print("ready", flush=True)
for line in sys.stdin:
    call = json.loads(line)
    env = {k.encode(): base64.b64decode(v) for k, v in call["env"].items()}
    done = subprocess.run(
        [binary], env=env, input=base64.b64decode(call["stdin"]), capture_output=True,
        timeout=60, check=False,
    )
    print(json.dumps({"rc": done.returncode, "out": done.stdout.decode("utf-8", "replace")}),
          flush=True)
"""


def as_environment(env: dict[str, str]) -> dict[str, bytes] | None:
    """The call's variables as a process environment holds them, or None when no
    process can be given them (a NUL byte, a lone surrogate): the in-process shim
    sees such values, a runtime can never pass them."""
    out = {}
    for key, value in env.items():
        try:
            encoded = value.encode("utf-8")
        except UnicodeEncodeError:
            return None
        if "\x00" in key or b"\x00" in encoded:
            return None
        out[key] = encoded
    return out


class NodeExec:
    """The helper process; `run` is one CNI call through the executable."""

    def __init__(self, binary: Path, server_socket: str) -> None:
        self.proc = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", sys.executable, "-c", HELPER,
             str(binary), server_socket],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        first = self._out().readline().strip()
        if first != "ready":
            self.close()
            raise RuntimeError(f"the executable's helper did not start: {first!r}")

    def _in(self) -> IO[str]:
        assert self.proc.stdin is not None
        return self.proc.stdin

    def _out(self) -> IO[str]:
        assert self.proc.stdout is not None
        return self.proc.stdout

    def run(self, env: dict[str, bytes], stdin: bytes) -> tuple[int, str]:
        call = {
            "env": {k: base64.b64encode(v).decode() for k, v in env.items()},
            "stdin": base64.b64encode(stdin).decode(),
        }
        self._in().write(json.dumps(call) + "\n")
        self._in().flush()
        answer = json.loads(self._out().readline())
        return int(answer["rc"]), str(answer["out"])

    def close(self) -> None:
        if self.proc.poll() is None:
            self._in().close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def can_unshare() -> bool:
    return os.geteuid() == 0
