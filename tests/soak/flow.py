"""An established TCP flow that the soak keeps open across its faults.

Standard library only; run inside a pod's network namespace:

* ``flow.py serve PORT`` echoes every byte back on each connection;
* ``flow.py client IP PORT`` opens one connection, sends a numbered line every
  :data:`INTERVAL_S` and reads its echo. Each line on stdin asks for a report, one
  JSON line on stdout: ``{"exchanges": n, "longest_gap_s": g, "since_last_s": s,
  "error": null | "..."}``. A flow is lost when the connection fails (reset,
  closed, a wrong echo); a gap is how long the echoes stopped and came back.
"""

from __future__ import annotations

import json
import socket
import socketserver
import sys
import threading
import time

INTERVAL_S = 0.2


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(4096):
            self.request.sendall(data)


class _Server(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True


class Client:
    """The pinging side; ``report`` is safe to call from another thread."""

    def __init__(self, ip: str, port: int) -> None:
        self.sock = socket.create_connection((ip, port), timeout=10)
        self.sock.settimeout(None)  # a stalled flow waits (TCP retransmits), it is not lost
        self.lock = threading.Lock()
        self.exchanges = 0
        self.longest_gap = 0.0
        self.last = time.monotonic()
        self.error: str | None = None

    def run(self) -> None:
        reader = self.sock.makefile("rb")
        number = 0
        try:
            while True:
                line = f"{number}\n".encode()
                self.sock.sendall(line)
                if reader.readline() != line:
                    raise ConnectionError(f"echo of {number} missing or wrong")
                now = time.monotonic()
                with self.lock:
                    self.longest_gap = max(self.longest_gap, now - self.last)
                    self.last = now
                    self.exchanges += 1
                number += 1
                time.sleep(INTERVAL_S)
        except OSError as err:
            with self.lock:
                self.error = f"{type(err).__name__}: {err}"

    def report(self) -> dict[str, object]:
        with self.lock:
            since = time.monotonic() - self.last
            return {
                "exchanges": self.exchanges,
                "longest_gap_s": round(max(self.longest_gap, since), 3),
                "since_last_s": round(since, 3),
                "error": self.error,
            }


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "serve":
        with _Server(("0.0.0.0", int(argv[1])), _Echo) as server:
            print(json.dumps({"ready": True}), flush=True)
            server.serve_forever()
        return 0
    if len(argv) == 3 and argv[0] == "client":
        client = Client(argv[1], int(argv[2]))
        threading.Thread(target=client.run, daemon=True).start()
        print(json.dumps({"ready": True}), flush=True)
        for _ in sys.stdin:
            print(json.dumps(client.report()), flush=True)
        return 0
    print("usage: flow.py serve PORT | flow.py client IP PORT", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
