"""The one seam through which the dataplane runs iptables, ipset and helpers.

Everything that touches the kernel's packet-filtering state is a command with
an argv and an optional stdin. Keeping that behind :class:`CommandRunner`
means the desired-state tables are tested against a stateful fake, and the
real runner is the single place that decides *which* network namespace a
command acts on: with ``netns`` set, every command is prefixed with
``ip netns exec <netns>`` so tests can never program the host by accident.
"""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CommandResult:
    """What a command did: exit status and both streams, for error reports."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


class CommandError(RuntimeError):
    """A command failed; carries the result so callers can log stdin/stderr."""

    def __init__(self, result: CommandResult, stdin: str | None = None) -> None:
        super().__init__(
            f"{' '.join(result.argv)} failed ({result.returncode}): {result.stderr.strip()}"
        )
        self.result = result
        self.stdin = stdin


class CommandRunner(Protocol):
    """Runs one command; never raises for a non-zero exit (callers decide)."""

    def run(self, argv: Sequence[str], stdin: str | None = None) -> CommandResult: ...


@dataclass
class SubprocessRunner:
    """The real runner: a subprocess, optionally inside a named network namespace.

    ``netns=None`` means the namespace the agent itself runs in (in a cluster,
    the node's); tests always pass a namespace they created.
    """

    netns: str | None = None
    timeout: float = 60.0

    def run(self, argv: Sequence[str], stdin: str | None = None) -> CommandResult:
        full = list(argv) if self.netns is None else ["ip", "netns", "exec", self.netns, *argv]
        try:
            proc = subprocess.run(
                full,
                input=stdin,
                capture_output=True,
                text=True,
                check=False,
                timeout=self.timeout,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.warning("command %s could not run: %s", full, exc)
            return CommandResult(tuple(argv), 127, "", str(exc))
        return CommandResult(tuple(argv), proc.returncode, proc.stdout, proc.stderr)


def check(runner: CommandRunner, argv: Sequence[str], stdin: str | None = None) -> str:
    """Run argv and return stdout, raising :class:`CommandError` on failure."""
    result = runner.run(argv, stdin)
    if not result.ok:
        raise CommandError(result, stdin)
    return result.stdout
