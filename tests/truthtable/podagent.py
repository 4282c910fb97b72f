"""A pod's server and prober in one process, run inside the pod's network namespace.

Standard library only (it runs as ``python podagent.py --ports 80,81`` under
``ip netns exec``), like the ``agnhost porter`` + ``agnhost connect`` pair of the
upstream NetworkPolicy e2e tests:

* **serves** TCP (accept, close) and UDP (echo) on every port given, and SCTP
  through a raw socket: the kernel here has no SCTP sockets (``IP_SCTP`` is not
  built), but netfilter's SCTP match, conntrack and NAT are, so an INIT to one of
  the ports is answered with an INIT-ACK built by hand (correct CRC32c, the
  verification tag conntrack checks);
* **probes** on request: it reads one JSON line per batch on stdin,
  ``{"timeout": 1.0, "probes": [[id, "tcp"|"udp"|"sctp", ip, port], ...]}``,
  runs all of them at once (asyncio) and writes one JSON line back,
  ``{"results": {id: "ok"|"timeout"|"refused"|"error: ..."}}``. A probe is a new
  connection: TCP = handshake, UDP = a reply from the address probed, SCTP = an
  INIT answered by an INIT-ACK from the address probed (so a Service address must
  be translated back on the reply, as for TCP and UDP).

Nothing is decided here: the caller compares the results with its expectations.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import socket
import struct
import sys
from collections.abc import Callable
from typing import Any

IPPROTO_SCTP = 132
SCTP_INIT, SCTP_INIT_ACK = 1, 2
SCTP_STATE_COOKIE = 7


# ---------------------------------------------------------------- SCTP by hand


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_CRC32C = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC32c (Castagnoli), as SCTP's common header carries it (RFC 9260 App. A)."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC32C[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def sctp_packet(sport: int, dport: int, vtag: int, chunk: bytes) -> bytes:
    """Common header + one chunk, with the checksum filled in (little-endian on the wire)."""
    header = struct.pack("!HHII", sport, dport, vtag, 0)
    checksum = crc32c(header + chunk)
    return struct.pack("!HHI", sport, dport, vtag) + struct.pack("<I", checksum) + chunk


def init_chunk(chunk_type: int, init_tag: int, tsn: int, params: bytes = b"") -> bytes:
    """INIT or INIT-ACK: initiate tag, a_rwnd, 10 streams each way, initial TSN."""
    body = struct.pack("!IIHHI", init_tag, 65535, 10, 10, tsn) + params
    return struct.pack("!BBH", chunk_type, 0, 4 + len(body)) + body


def parse_sctp(datagram: bytes) -> tuple[str, int, int, int, int, int] | None:
    """(src ip, sport, dport, vtag, first chunk type, its initiate tag) of a raw IPv4 read."""
    if len(datagram) < 20:
        return None
    ihl = (datagram[0] & 0x0F) * 4
    sctp = datagram[ihl:]
    if len(sctp) < 12 + 4 + 4:
        return None
    sport, dport, vtag = struct.unpack("!HHI", sctp[:8])
    chunk_type = sctp[12]
    init_tag = struct.unpack("!I", sctp[16:20])[0] if chunk_type in (1, 2) else 0
    src = socket.inet_ntoa(datagram[12:16])
    return src, sport, dport, vtag, chunk_type, init_tag


def _nonzero_tag() -> int:
    return secrets.randbits(32) or 1


class SourcePorts:
    """Every probe gets a source port no earlier probe of this pod used.

    A probe must be a *new* connection: with a reused 5-tuple, a UDP or SCTP
    probe would ride on a conntrack entry an earlier (allowed) probe left, and
    established flows pass whatever the policy now says.
    """

    FIRST, LAST = 20000, 60999

    def __init__(self) -> None:
        self.next = self.FIRST + secrets.randbelow(1000)

    def take(self) -> int:
        port = self.next
        self.next = self.FIRST if port >= self.LAST else port + 1
        return port


# ---------------------------------------------------------------- servers


class UdpEcho(asyncio.DatagramProtocol):
    """Replies with the datagram it got (agnhost replies with its hostname)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:
        self.transport.sendto(data, addr)  # type: ignore[attr-defined]


async def _tcp_accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()


class SctpRaw:
    """One raw SCTP socket: answers INITs to served ports, completes probes' INIT-ACKs."""

    def __init__(self, loop: asyncio.AbstractEventLoop, ports: set[int]) -> None:
        self.ports = ports
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, IPPROTO_SCTP)
        self.sock.setblocking(False)
        self.waiting: dict[tuple[str, int, int, int], asyncio.Future[None]] = {}
        self.answered = 0
        loop.add_reader(self.sock.fileno(), self._readable)

    def _readable(self) -> None:
        while True:
            try:
                datagram = self.sock.recv(65535)
            except BlockingIOError:
                return
            except OSError:
                return
            parsed = parse_sctp(datagram)
            if parsed is not None:
                self._handle(*parsed)

    def _handle(self, src: str, sport: int, dport: int, vtag: int, kind: int, tag: int) -> None:
        if kind == SCTP_INIT and dport in self.ports and vtag == 0:
            cookie = struct.pack("!HH", SCTP_STATE_COOKIE, 12) + secrets.token_bytes(8)
            chunk = init_chunk(SCTP_INIT_ACK, _nonzero_tag(), secrets.randbits(32), cookie)
            with contextlib.suppress(OSError):
                self.sock.sendto(sctp_packet(dport, sport, tag, chunk), (src, 0))
            self.answered += 1
        elif kind == SCTP_INIT_ACK:
            future = self.waiting.get((src, sport, dport, vtag))
            if future is not None and not future.done():
                future.set_result(None)

    async def probe(self, ip: str, port: int, sport: int, timeout: float) -> str:
        """INIT to ip:port; ok when an INIT-ACK for our tag comes back from ip."""
        tag = _nonzero_tag()
        key = (ip, port, sport, tag)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting[key] = future
        try:
            packet = sctp_packet(sport, port, 0, init_chunk(SCTP_INIT, tag, secrets.randbits(32)))
            self.sock.sendto(packet, (ip, 0))
            await asyncio.wait_for(future, timeout)
            return "ok"
        except TimeoutError:
            return "timeout"
        except OSError as exc:
            return f"error: {exc}"
        finally:
            self.waiting.pop(key, None)


# ---------------------------------------------------------------- probes


async def probe_tcp(ip: str, port: int, sport: int, timeout: float) -> str:
    """A TCP handshake (agnhost connect: dial only)."""
    try:
        _, writer = await asyncio.wait_for(
            asyncio.open_connection(ip, port, local_addr=("0.0.0.0", sport)), timeout
        )
    except TimeoutError:
        return "timeout"
    except ConnectionRefusedError:
        return "refused"
    except OSError as exc:
        return f"error: {exc}"
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return "ok"


class _UdpClient(asyncio.DatagramProtocol):
    def __init__(self, done: asyncio.Future[str]) -> None:
        self.done = done

    def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:
        if not self.done.done():
            self.done.set_result("ok")

    def error_received(self, exc: Exception) -> None:
        if not self.done.done():
            refused = isinstance(exc, ConnectionRefusedError)
            self.done.set_result("refused" if refused else f"error: {exc}")


async def probe_udp(ip: str, port: int, sport: int, timeout: float) -> str:
    """A datagram to a connected socket; ok when the reply comes from ip:port."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[str] = loop.create_future()
    try:
        transport, _ = await loop.create_datagram_endpoint(
            lambda: _UdpClient(done), local_addr=("0.0.0.0", sport), remote_addr=(ip, port)
        )
    except OSError as exc:
        return f"error: {exc}"
    try:
        transport.sendto(b"probe\n")
        return await asyncio.wait_for(done, timeout)
    except TimeoutError:
        return "timeout"
    finally:
        transport.close()


# ---------------------------------------------------------------- the agent


class PodAgent:
    """Servers for the pod's ports plus a probe loop on stdin/stdout."""

    def __init__(self, ports: list[int]) -> None:
        self.ports = ports
        self.sctp: SctpRaw | None = None
        self.source_ports = SourcePorts()
        self.limit = asyncio.Semaphore(256)

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        for port in self.ports:
            await asyncio.start_server(_tcp_accept, "0.0.0.0", port, backlog=512)
            await loop.create_datagram_endpoint(UdpEcho, local_addr=("0.0.0.0", port))
        self.sctp = SctpRaw(loop, set(self.ports))

    async def one(self, proto: str, ip: str, port: int, timeout: float) -> str:
        assert self.sctp is not None
        async with self.limit:
            sport = self.source_ports.take()
            if proto == "tcp":
                return await probe_tcp(ip, port, sport, timeout)
            if proto == "udp":
                return await probe_udp(ip, port, sport, timeout)
            return await self.sctp.probe(ip, port, sport, timeout)

    async def batch(self, request: dict[str, Any]) -> dict[str, Any]:
        timeout = float(request.get("timeout", 1.0))
        probes = request["probes"]
        outcomes = await asyncio.gather(
            *(self.one(proto, ip, int(port), timeout) for _, proto, ip, port in probes)
        )
        return {"results": {p[0]: r for p, r in zip(probes, outcomes, strict=True)}}

    async def run(self) -> None:
        await self.serve()
        reader = await _stdin_reader()
        _write({"ready": True, "pid": os.getpid()})
        while True:
            line = await reader.readline()
            if not line:
                return
            _write(await self.batch(json.loads(line)))


async def _stdin_reader() -> asyncio.StreamReader:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 24)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    return reader


def _write(obj: dict[str, Any], out: Callable[[str], Any] = sys.stdout.write) -> None:
    out(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ports", default="80,81", help="ports served on TCP, UDP and SCTP")
    opts = parser.parse_args()
    ports = [int(p) for p in opts.ports.split(",") if p]
    with contextlib.suppress(KeyboardInterrupt, BrokenPipeError):
        asyncio.run(PodAgent(ports).run())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
