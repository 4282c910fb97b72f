"""The unix-socket server: one JSON request in, one JSON answer out, one thread
per connection; and ``python -m felix.cni_server``, a standalone agent with a
local pool for tests and the lab."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import socketserver
import threading
from typing import Any

from cni import results
from cni.shim import (
    ERR_DECODING,
    MAX_MESSAGE,
    CNIError,
    caller_version,
)
from felix.cni_server.handlers import DEFAULT_MTU, CNIHandlers
from felix.cni_server.request import forwarded_stdin, parse_request

log = logging.getLogger(__name__)

READ_TIMEOUT_S = 30.0


def _read_request(conn: socket.socket) -> bytes:
    conn.settimeout(READ_TIMEOUT_S)
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = conn.recv(65536)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > MAX_MESSAGE:
            raise CNIError(ERR_DECODING, "request is too large")
        chunks.append(chunk)


def answer(handlers: CNIHandlers, raw: bytes) -> dict[str, Any]:
    """Turn raw request bytes into the answer object (never raises)."""
    version = "1.1.0"
    try:
        try:
            message = json.loads(raw)
        except ValueError as exc:
            raise CNIError(ERR_DECODING, "request is not JSON", str(exc)) from None
        stdin = forwarded_stdin(message)
        if stdin is not None:  # errors speak the caller's version, as the shim's did
            version = caller_version(stdin)
        request = parse_request(message)
        version = request.version
        return {"result": handlers.handle(request)}
    except CNIError as exc:
        return {"error": exc.to_dict(version)}
    except Exception as exc:
        log.exception("CNI request failed")
        return {"error": results.internal_error(exc).to_dict(version)}


class _Handler(socketserver.BaseRequestHandler):
    server: CNIServer

    def handle(self) -> None:
        conn: socket.socket = self.request
        try:
            raw = _read_request(conn)
        except (OSError, CNIError) as exc:
            log.warning("dropping CNI connection: %s", exc)
            return
        reply = answer(self.server.handlers, raw)
        try:
            conn.sendall(json.dumps(reply).encode())
        except OSError as exc:
            log.warning("CNI client went away before the answer: %s", exc)


class CNIServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """Threaded server on a root-only socket (dir 0700, socket 0600)."""

    daemon_threads = True
    allow_reuse_address = False
    request_queue_size = 256  # a burst of pod starts must queue, not be refused

    def __init__(self, path: str, handlers: CNIHandlers) -> None:
        self.handlers = handlers
        self.path = path
        _prepare_socket_path(path)
        super().__init__(path, _Handler)
        os.chmod(path, 0o600)
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Serve in a background thread."""
        self._thread = threading.Thread(target=self.serve_forever, name="cni-server", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and remove the socket file."""
        self.shutdown()
        self.server_close()
        if os.path.exists(self.path):
            os.unlink(self.path)


def _prepare_socket_path(path: str) -> None:
    """Dir 0700 owned by us; a stale socket from a dead agent is replaced."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, mode=0o700, exist_ok=True)
    os.chmod(directory, 0o700)
    if os.path.exists(path):
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
        except OSError:
            os.unlink(path)
        else:
            raise RuntimeError(f"another agent is already serving {path}")
        finally:
            probe.close()


_MAIN_PID = os.getpid()


def _exit_on_signal(signum: int, _frame: object) -> None:
    """SIGTERM ends the agent; in a forked helper (pyroute2) it must not unwind."""
    if os.getpid() != _MAIN_PID:
        os._exit(128 + signum)
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    """Standalone agent for tests and the lab: a local pool, no datastore."""
    from felix.pool_allocator import PoolAllocator

    parser = argparse.ArgumentParser(description="Tabby CNI server with a local address pool")
    parser.add_argument("--socket", default="/run/tabby/cni.sock")
    parser.add_argument("--pool", required=True, help="IPv4 CIDR to assign pod addresses from")
    parser.add_argument("--mtu", type=int, default=DEFAULT_MTU)
    parser.add_argument("--not-synced", action="store_true", help="start not ready (STATUS 50)")
    opts = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    handlers = CNIHandlers(PoolAllocator(opts.pool), default_mtu=opts.mtu)
    handlers.set_synced(not opts.not_synced)
    server = CNIServer(opts.socket, handlers)
    signal.signal(signal.SIGTERM, _exit_on_signal)
    log.info("serving CNI on %s (pool %s)", opts.socket, opts.pool)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        handlers.close()
        if os.path.exists(opts.socket):
            os.unlink(opts.socket)
    return 0
