"""tabby-controllers' command line: arguments, one pass, failures."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from controllers import main as gc_main
from datastore.client import Datastore
from datastore.errors import Unavailable
from datastore.memory import MemoryTransport


@pytest.fixture
def transport(monkeypatch: pytest.MonkeyPatch) -> MemoryTransport:
    transport = MemoryTransport()
    monkeypatch.setattr(
        Datastore, "from_kubeconfig", classmethod(lambda cls, path: Datastore(transport))
    )
    return transport


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--kubeconfig=k", "--gc-interval-seconds=0"], "must be more than 0 seconds"),
        (["--kubeconfig=k", "--gc-grace-seconds=soon"], "'soon' is not a number of seconds"),
        ([], "no kubeconfig"),
    ],
)
def test_bad_arguments_are_named(
    argv: list[str],
    message: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    with pytest.raises(SystemExit) as exited:
        gc_main.parse_args(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_once_runs_a_pass_and_touches_the_heartbeat(
    transport: MemoryTransport, tmp_path: Path
) -> None:
    heartbeat = tmp_path / "alive"
    argv = ["--kubeconfig=k", "--once", f"--heartbeat-file={heartbeat}"]
    assert gc_main.main(argv) == 0
    assert heartbeat.exists()
    assert transport.requests > 0  # it read the cluster


def test_failed_pass_exits_1_and_leaves_the_heartbeat_alone(
    transport: MemoryTransport, tmp_path: Path
) -> None:
    def outage(method: str, path: str) -> None:
        raise Unavailable("apiserver unreachable")

    transport.fault_hook = outage
    heartbeat = tmp_path / "alive"
    argv = ["--kubeconfig=k", "--once", f"--heartbeat-file={heartbeat}"]
    assert gc_main.main(argv) == 1
    assert not heartbeat.exists()


class _FakeStatus:
    """Stands in for PolicyStatusController (its informers need a real apiserver)."""

    made: list[_FakeStatus] = []

    def __init__(self, datastore: Datastore) -> None:
        self.events: list[str] = []
        _FakeStatus.made.append(self)

    def start(self) -> None:
        self.events.append("start")

    def stop(self) -> None:
        self.events.append("stop")


@pytest.mark.parametrize(("env", "runs"), [(None, True), ("off", False)])
def test_the_policy_status_controller_runs_beside_gc_unless_turned_off(
    transport: MemoryTransport,
    monkeypatch: pytest.MonkeyPatch,
    env: str | None,
    runs: bool,
) -> None:
    _FakeStatus.made.clear()
    monkeypatch.setattr(gc_main, "PolicyStatusController", _FakeStatus)
    if env is None:
        monkeypatch.delenv("POLICY_STATUS", raising=False)
    else:
        monkeypatch.setenv("POLICY_STATUS", env)

    def term_after_first_pass(gc: object, heartbeat: object) -> None:
        signal.raise_signal(signal.SIGTERM)  # the handler main installed ends the loop

    monkeypatch.setattr(gc_main, "run_pass", term_after_first_pass)
    previous = signal.getsignal(signal.SIGTERM)
    try:
        assert gc_main.main(["--kubeconfig=k"]) == 0
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert [f.events for f in _FakeStatus.made] == ([["start", "stop"]] if runs else [])
