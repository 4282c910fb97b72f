"""The one seam to the BGP speaker: an ExaBGP process, supervised, and its API bridge.

Process layout (research notes 1.3, 1.4, 2.1):

    agent (this class) ──unix socket── api_helper.py (ExaBGP's child)
       │
       └── ExaBGP's stdin/stdout pipes, handed over by the helper ── ExaBGP ── peers

- The agent writes ExaBGP's config file (bgp.config), starts `exabgp server` in its
  own session (SIGHUP would mean shutdown to ExaBGP), with `exabgp_daemon_user=root`
  (else the helper runs as nobody) and `exabgp_api_cli=false`.
- The helper passes ExaBGP's pipes to the agent over the socket (SCM_RIGHTS) and
  then only waits: the agent reads every event line straight from ExaBGP, parses
  it (bgp.messages), feeds it to the pure SpeakerCore (bgp.rib) and writes the
  core's commands into ExaBGP's command pipe, with no relay process in between.
- Supervision: when ExaBGP exits it is restarted with exponential backoff; the
  core treats that as every session going down (their routes are dropped).
- ExaBGP dies with its agent: it is started with a parent-death signal (prctl
  PR_SET_PDEATHSIG), so a `kill -9` of the agent takes it along instead of leaving
  an orphan that holds port 179 with the old config and no driver. Where that did
  not happen (an older agent, a signal ExaBGP ignored), a pidfile in the workdir
  names the speaker we started; the next start stops it first, but only after
  checking that the pid is still that process (same start time and boot, our config
  file on its command line), never by name (`stop_orphan`).
- A changed peer set rewrites the config and sends SIGUSR1 (reload); new peers get
  our routes replayed when they come up.
- Every change of peer state is written to a JSON status file for `tabbyctl node
  status` (format: `status_document`).

Callbacks (`on_routes`) run on the reader thread, outside the lock, with the full
learned-route list: the agent turns it into kernel routes (bgp.routes, bgp.kernel).
`SpeakerOptions.on_peers` gets the peer list whenever a peer's state changes, as
it happens (the agent's /readyz follows BGP without waiting for a resync pass).
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import logging
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from bgp.config import BGPPlan, RenderOptions, render_exabgp_config
from bgp.messages import Ack, LearnedRoute, Unparsed, parse_line
from bgp.rib import SpeakerCore

log = logging.getLogger(__name__)

STATUS_VERSION = 1
MAX_UNIX_PATH = 107  # sun_path holds 108 bytes with the terminating NUL
HELPER = Path(__file__).with_name("api_helper.py")
RoutesCallback = Callable[[list[LearnedRoute]], None]
PeersCallback = Callable[[list[dict[str, Any]]], None]
PIDFILE_VERSION = 1
F_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ, spelled out for Pythons that lack it
PIPE_SIZE = 1 << 20


class _Writer(Protocol):
    def sendall(self, data: bytes) -> None: ...
    def close(self) -> None: ...


class _Pipe:
    """ExaBGP's command pipe with a socket's `sendall` (blocking: ExaBGP reads it)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def sendall(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view) :]

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


def default_status_path(run_dir: Path = Path("/run/tabby")) -> Path:
    """Where the agent publishes BGP status for `tabbyctl node status`."""
    return run_dir / "bgp-status.json"


def exabgp_env(base: dict[str, str] | None = None, log_level: str = "INFO") -> dict[str, str]:
    """ExaBGP settings that matter (research notes 1.4): helpers as root, no CLI FIFOs."""
    env = dict(os.environ if base is None else base)
    env.update(
        {
            "exabgp_daemon_user": "root",
            "exabgp_daemon_daemonize": "false",
            "exabgp_api_cli": "false",
            "exabgp_api_ack": "true",
            "exabgp_log_level": log_level,
            "exabgp_log_short": "false",
        }
    )
    return env


@dataclass
class SpeakerOptions:
    """Where files go and how ExaBGP is started."""

    workdir: Path
    # ExaBGP's command with a reload that is never dropped (bgp/exabgp_launcher.py),
    # run by `python`
    exabgp: str = str(Path(__file__).with_name("exabgp_launcher.py"))
    python: str = sys.executable
    command_prefix: Sequence[str] = ()  # e.g. ("ip", "netns", "exec", "<ns>") in tests
    status_file: Path | None = None
    render: RenderOptions = field(default_factory=RenderOptions)
    log_level: str = "WARNING"  # INFO logs every session event: for debugging
    backoff_initial: float = 0.5
    backoff_max: float = 30.0
    stop_timeout: float = 5.0
    # sent to ExaBGP when the thread that started it (so the agent) dies; None: not set
    parent_death_signal: int | None = signal.SIGTERM
    on_peers: PeersCallback | None = None  # peer list (status JSON) on every state change

    @property
    def config_file(self) -> Path:
        return self.workdir / "exabgp.conf"

    @property
    def socket_path(self) -> Path:
        return self.workdir / "api.sock"

    @property
    def log_file(self) -> Path:
        return self.workdir / "exabgp.log"

    @property
    def pid_file(self) -> Path:
        return self.workdir / "exabgp.pid"


# -- the speaker we own: pidfile and process identity ------------------------------------
def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def process_start_time(pid: int) -> int | None:
    """Start time of a live (not zombie) process in clock ticks since boot, else None.

    With the boot id, (pid, start time) names one process for good: a reused pid
    has another start time.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # the name in parentheses may hold spaces
    if fields[0] in ("Z", "X"):
        return None  # exited (a zombie holds no socket any more)
    return int(fields[19])


def process_argv(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]


def speaker_record(pid: int, config_file: Path) -> dict[str, Any] | None:
    """What the pidfile says about a speaker we just started (None: it is gone already)."""
    started = process_start_time(pid)
    if started is None:
        return None
    return {
        "version": PIDFILE_VERSION,
        "pid": pid,
        "startTime": started,
        "bootId": _boot_id(),
        "config": str(config_file),
    }


def is_our_speaker(record: dict[str, Any], config_file: Path) -> bool:
    """Whether the pidfile's process is still the ExaBGP we started (and alive).

    All must hold: same boot, same start time (not a reused pid), our config file
    on its command line (`ip netns exec … exabgp server <config>` before the exec,
    `python …/exabgp server <config>` after: the path is on both).
    """
    try:
        pid, started = int(record["pid"]), int(record["startTime"])
    except (KeyError, TypeError, ValueError):
        return False
    if pid <= 1 or pid == os.getpid() or record.get("config") != str(config_file):
        return False
    if record.get("bootId") != _boot_id() or process_start_time(pid) != started:
        return False
    return str(config_file) in process_argv(pid)


def stop_orphan(options: SpeakerOptions) -> int | None:
    """Stop the speaker a previous agent left running (its pidfile); its pid, or None.

    A pidfile that names any other process (pid reused, edited by hand, another
    program) is only removed: nothing is killed on a guess.
    """
    path = options.pid_file
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        log.warning("ignoring unreadable %s: %s", path, err)
        record = {}
    if not isinstance(record, dict) or not is_our_speaker(record, options.config_file):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return None
    pid = int(record["pid"])
    log.warning("stopping ExaBGP pid %d left running by a previous agent", pid)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        _signal_speaker(pid, sig)
        deadline = time.monotonic() + options.stop_timeout
        while time.monotonic() < deadline:
            if process_start_time(pid) != record["startTime"]:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                return pid
            time.sleep(0.02)
    log.error("ExaBGP pid %d (left by a previous agent) survived SIGKILL", pid)
    return pid


def _signal_speaker(pid: int, sig: int) -> None:
    """Its whole group when it leads one (ExaBGP and its API helper), else it alone."""
    with contextlib.suppress(ProcessLookupError):
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)


# Run by ExaBGP's own process before it becomes ExaBGP: ask for `sig` when the thread
# that forked it dies, give up if that already happened, then exec the real command.
# (A preexec_fn would run Python between fork and exec in a threaded agent: unsafe.)
PARENT_DEATH_SHIM = (
    "import ctypes,os,sys;"
    "ctypes.CDLL(None,use_errno=True).prctl(1,int(sys.argv[1]),0,0,0);"
    "os.getppid()==int(sys.argv[2]) or os._exit(1);"
    "os.execvp(sys.argv[3],sys.argv[3:])"
)


def with_parent_death(argv: Sequence[str], sig: int | None, python: str) -> list[str]:
    """`argv`, started so that it gets `sig` when the agent dies (PR_SET_PDEATHSIG,
    kept across exec; ExaBGP keeps its pid); `argv` alone when sig is None."""
    if sig is None:
        return list(argv)
    return [python, "-S", "-c", PARENT_DEATH_SHIM, str(int(sig)), str(os.getpid()), *argv]


class Speaker:
    """One supervised ExaBGP process and the bridge to its API."""

    def __init__(
        self, plan: BGPPlan, options: SpeakerOptions, on_routes: RoutesCallback | None = None
    ) -> None:
        self.options = options
        self.on_routes = on_routes
        self.core = SpeakerCore(plan)
        self._lock = threading.RLock()
        self._callback_lock = threading.Lock()  # callbacks in order, one at a time
        self._status_lock = threading.Lock()
        self._last_status: dict[str, Any] | None = None  # as last written, less "updated"
        self._last_peers: list[tuple[str, str]] | None = None  # (address, state) as last told
        self._config_text: str | None = None
        # A config change while ExaBGP starts: SIGUSR1 would kill it before its handler
        # is installed, so the reload waits until its API helper attaches.
        self._reload_owed = False
        self._stop = threading.Event()
        self._conn: _Writer | None = None  # ExaBGP's command pipe, from the helper
        self._helper: socket.socket | None = None
        self._events: int | None = None  # ExaBGP's event pipe, from the helper
        self._buffer = b""  # a partial line read from it
        self._proc: subprocess.Popen[bytes] | None = None
        self._threads: list[threading.Thread] = []
        self._last_routes: list[LearnedRoute] = []
        self._last_synced = False
        self._next_tick = 0.0
        self.restarts = 0
        self.errors = 0  # `error` acks from ExaBGP
        if len(str(options.socket_path).encode()) > MAX_UNIX_PATH:
            raise ValueError(
                f"{options.socket_path}: too long for a unix socket; use a shorter workdir"
            )
        options.workdir.mkdir(parents=True, exist_ok=True)
        self._write_config(plan)

    # -- public ---------------------------------------------------------------------------
    def start(self) -> None:
        """Stop a speaker a dead agent left behind, listen for the helper (ExaBGP starts it
        at once), then run ExaBGP.

        The orphan goes first: it holds port 179, and its helper would attach to our
        socket.
        """
        stop_orphan(self.options)
        listener = self._listen()
        self._thread("bgp-api", self._serve, listener)
        self._thread("bgp-supervisor", self._supervise)
        self._write_status()

    def _thread(self, name: str, target: Callable[..., None], *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def stop(self) -> None:
        """Stop ExaBGP (TERM, then KILL) and the threads; safe to call twice."""
        self._stop.set()
        self._terminate()
        for thread in self._threads:
            thread.join(timeout=self.options.stop_timeout + 2)
        self._threads = []
        with contextlib.suppress(FileNotFoundError):
            self.options.socket_path.unlink()
        if self.pid is None:
            with contextlib.suppress(FileNotFoundError):
                self.options.pid_file.unlink()
        self._write_status()

    def update_plan(self, plan: BGPPlan) -> None:
        """New peers or local facts: reconfigure ExaBGP (SIGUSR1) if the config changed."""
        with self._lock:
            self._send(self.core.set_plan(plan))
            changed = self._write_config(plan)
            if changed and self._conn is None:
                self._reload_owed = True
                changed = False
            proc = self._proc
        if changed and proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGUSR1)
        self._after_change()

    def announce(self, prefixes: Iterable[ipaddress.IPv4Network]) -> None:
        """Set our own announcements (blocks and borrowed /32s); only changes are sent."""
        with self._lock:
            self._send(self.core.set_origin(prefixes))
        self._after_change()

    def learned_routes(self) -> list[LearnedRoute]:
        with self._lock:
            return self.core.learned_routes()

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def status_document(self) -> dict[str, Any]:
        """The status file's content (version 1); see tabbyctl.node for the reader."""
        with self._lock:
            return {
                "version": STATUS_VERSION,
                "node": self.core.local.node,
                "agentPid": os.getpid(),
                # The agent's PID is in its own PID namespace when it runs in a pod:
                # tabbyctl on the node finds it by this namespace (tabbyctl.node).
                "pidNamespace": _pid_namespace(),
                "speaker": "exabgp",
                "speakerPid": self.pid,
                "speakerRunning": self.pid is not None,
                "stopped": self._stop.is_set(),
                "routerId": str(self.core.local.router_id),
                "asNumber": self.core.local.as_number,
                "updated": time.time(),
                "announced": [str(p) for p in sorted(self.core.origin)],
                "learnedRoutes": len(self.core.learned_routes()),
                "synced": self.core.synced(),
                "peers": [s.to_json() for s in self.core.peer_statuses()],
            }

    # -- config ---------------------------------------------------------------------------
    def _write_config(self, plan: BGPPlan) -> bool:
        """Write the config atomically; True when its text changed."""
        # -S: the helper needs only the standard library; skipping site saves ~1.6 MB
        argv = [self.options.python, "-S", str(HELPER), str(self.options.socket_path)]
        text = render_exabgp_config(plan, argv, self.options.render)
        path = self.options.config_file
        if text == self._config_text or (path.exists() and path.read_text() == text):
            self._config_text = text
            return False
        tmp = path.with_suffix(".tmp")
        # root's alone: it may hold TCP MD5 passwords (base64, not encrypted)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(text)
        tmp.chmod(0o600)  # a file left by an older agent keeps its mode otherwise
        tmp.replace(path)
        self._config_text = text
        return True

    # -- the ExaBGP process -----------------------------------------------------------------
    def _supervise(self) -> None:
        backoff = self.options.backoff_initial
        while not self._stop.is_set():
            started = time.monotonic()
            proc = self._spawn()
            proc.wait()
            if self._stop.is_set():
                break
            log.warning("exabgp exited with %s; restarting in %.1fs", proc.returncode, backoff)
            with self._lock:
                self.restarts += 1
                self._send(self.core.speaker_restarted())
            self._after_change()
            if time.monotonic() - started > 60:
                backoff = self.options.backoff_initial
            self._stop.wait(backoff)
            backoff = min(backoff * 2, self.options.backoff_max)

    def _spawn(self) -> subprocess.Popen[bytes]:
        argv = [*self.options.command_prefix, self.options.python, self.options.exabgp, "server"]
        argv.append(str(self.options.config_file))
        argv = with_parent_death(argv, self.options.parent_death_signal, self.options.python)
        with self.options.log_file.open("ab") as logf:
            proc = subprocess.Popen(
                argv,
                env=exabgp_env(log_level=self.options.log_level),
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # no SIGHUP from our terminal; one group to kill
                cwd=self.options.workdir,
            )
        with self._lock:
            self._proc = proc
            self._reload_owed = False  # it reads the file as it is now
        self._write_pidfile(proc.pid)
        self._write_status()
        return proc

    def _write_pidfile(self, pid: int) -> None:
        """Name the speaker we started, for the next agent if this one dies without it."""
        record = speaker_record(pid, self.options.config_file)
        if record is None:
            return
        path = self.options.pid_file
        try:
            tmp = path.with_suffix(".pid.tmp")
            tmp.write_text(json.dumps(record))
            tmp.replace(path)
        except OSError as err:
            log.warning("cannot write %s: %s", path, err)

    def _terminate(self) -> None:
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=self.options.stop_timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=self.options.stop_timeout)

    # -- the API bridge ---------------------------------------------------------------------
    def _listen(self) -> socket.socket:
        path = self.options.socket_path
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(path))
        os.chmod(path, 0o600)
        listener.listen(2)
        return listener

    def _serve(self, listener: socket.socket) -> None:
        """Accept the helper, take ExaBGP's pipes from it, read events from them.

        A new helper (ExaBGP respawned it, or a new ExaBGP) replaces the old one.
        """
        sel = selectors.DefaultSelector()
        sel.register(listener, selectors.EVENT_READ, None)
        try:
            while not self._stop.is_set():
                for key, _ in sel.select(timeout=0.2):
                    if key.data is None:
                        self._accept(listener, sel)
                    elif key.data == "helper":
                        self._helper_event(sel)
                    else:
                        self._read(sel)
                self._tick()
        finally:
            self._detach(sel)
            listener.close()

    def _accept(self, listener: socket.socket, sel: selectors.BaseSelector) -> None:
        conn, _ = listener.accept()
        try:
            conn.settimeout(5.0)
            _, fds, _, _ = socket.recv_fds(conn, 64, 2)
        except OSError as err:
            log.warning("api helper did not hand over its pipes: %s", err)
            conn.close()
            return
        if len(fds) != 2:
            for fd in fds:
                os.close(fd)
            conn.close()
            return
        self._detach(sel)
        events, commands = fds
        with contextlib.suppress(OSError):  # room for bursts while we program the kernel
            fcntl.fcntl(events, F_SETPIPE_SZ, PIPE_SIZE)
        self._helper, self._events, self._buffer = conn, events, b""
        sel.register(conn, selectors.EVENT_READ, "helper")
        sel.register(events, selectors.EVENT_READ, "events")
        self._attach(_Pipe(commands))

    def _helper_event(self, sel: selectors.BaseSelector) -> None:
        """The helper only ever closes its socket: it died, or ExaBGP is stopping."""
        helper = self._helper
        try:
            data = helper.recv(1024) if helper is not None else b""
        except OSError:
            data = b""
        if not data:
            self._detach(sel)

    def _detach(self, sel: selectors.BaseSelector) -> None:
        """Forget the current helper and close our copies of its pipes."""
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
        for obj in (self._helper, self._events):
            if obj is not None:
                with contextlib.suppress(KeyError, ValueError):
                    sel.unregister(obj)
        if self._helper is not None:
            self._helper.close()
        if self._events is not None:
            with contextlib.suppress(OSError):
                os.close(self._events)
        self._helper, self._events, self._buffer = None, None, b""

    def _tick(self) -> None:
        """About once a second: expire stale routes, notice the end of the initial sync."""
        now = time.monotonic()
        if now < self._next_tick:
            return
        self._next_tick = now + 1.0
        with self._lock:
            expired, commands = self.core.tick()
            self._send(commands)
            synced = self.core.synced()
        if expired or synced != self._last_synced:
            self._after_change()

    def synced(self) -> bool:
        """BGP has caught up since start (see SpeakerCore.synced)."""
        with self._lock:
            return self.core.synced()

    def _attach(self, conn: _Writer) -> None:
        """ExaBGP's helper is up, so its signal handlers are: an owed reload goes now."""
        with self._lock:
            self._conn = conn
            self._send(self.core.resync())
            proc, owed, self._reload_owed = self._proc, self._reload_owed, False
        if owed and proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGUSR1)

    def _read(self, sel: selectors.BaseSelector) -> None:
        """ExaBGP's events, straight from its pipe; handled as one batch per read."""
        try:
            data = os.read(self._events, 1 << 20) if self._events is not None else b""
        except OSError:
            data = b""
        if not data:
            self._detach(sel)  # ExaBGP closed the pipe: it stopped or dropped the helper
            return
        lines = (self._buffer + data).split(b"\n")
        self._buffer = lines.pop()
        # every line first (replies and reflected routes go out at once), then one
        # status write and one kernel pass for the whole batch
        changed = [self._apply_line(line.decode("utf-8", "replace")) for line in lines]
        if any(changed):
            self._after_change()

    def _handle_line(self, line: str) -> None:
        """One API line, with its status and callback (tests feed lines through here)."""
        if self._apply_line(line):
            self._after_change()

    def _apply_line(self, line: str) -> bool:
        """Feed one API line to the core and send its commands; True if it was an event."""
        event = parse_line(line)
        if isinstance(event, Ack):
            if not event.ok:
                self.errors += 1
                log.warning("exabgp refused a command")
            return False
        if isinstance(event, Unparsed):
            log.debug("api: %s (%s)", event.line[:200], event.reason)
            return False
        with self._lock:
            self._send(self.core.handle(event))
        return True

    def _send(self, commands: list[str]) -> None:
        """Write commands to ExaBGP (lock held); lost if no helper is attached, see resync."""
        if not commands or self._conn is None:
            return
        try:
            self._conn.sendall("".join(c + "\n" for c in commands).encode("ascii"))
        except OSError as err:
            level = logging.DEBUG if self._stop.is_set() else logging.WARNING
            log.log(level, "api write failed: %s", err)

    # -- status and callbacks -----------------------------------------------------------
    def _after_change(self) -> None:
        """Routes to the callback (the kernel) first, then the status file."""
        self._routes_changed()
        self._write_status()

    def _routes_changed(self) -> None:
        with self._callback_lock:
            routes, synced = self.learned_routes(), self.synced()
            if (routes, synced) == (self._last_routes, self._last_synced):
                return
            self._last_routes, self._last_synced = routes, synced
            if self.on_routes is not None:
                try:
                    self.on_routes(routes)
                except Exception:
                    log.exception("route callback failed")

    def _notify_peers(self, doc: dict[str, Any]) -> None:
        """Tell `on_peers` when any peer's state changed (status lock held: in order)."""
        callback = self.options.on_peers
        if callback is None:
            return
        peers = doc["peers"]
        states = [(p["address"], p["state"]) for p in peers]
        if states == self._last_peers:
            return
        self._last_peers = states
        try:
            callback(peers)
        except Exception:
            log.exception("peer state callback failed")

    def _write_status(self) -> None:
        """Rewrite the status file when its content (the timestamp aside) changed."""
        with self._status_lock:
            doc = self.status_document()
            self._notify_peers(doc)
            path = self.options.status_file
            if path is None:
                return
            content = {k: v for k, v in doc.items() if k != "updated"}
            if content == self._last_status:
                return
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(f".{threading.get_ident()}.tmp")
                tmp.write_text(json.dumps(doc, indent=1))
                tmp.replace(path)
                self._last_status = content
            except OSError as err:
                log.warning("cannot write %s: %s", path, err)


def _pid_namespace() -> int | None:
    """The inode of this process's PID namespace (identifies it machine-wide)."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None
