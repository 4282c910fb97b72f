#!/usr/bin/python3 -IS
"""The ``tabby`` CNI executable: a thin shim in front of the node agent.

The container runtime runs this file for every ADD, DEL, CHECK, STATUS, GC and
VERSION call (it is copied to the CNI bin dir and run as ``python3 -I -S``).
Start-up time is paid once per pod operation, so the file imports only ``os``,
``sys`` and the C cores ``_json`` and ``_socket`` (see :func:`loads`; ``fcntl``
only when a netns is checked) and holds no state: it checks the call,
forwards ``{command, env, args, config}`` as one JSON message to the node agent
over a root-only unix socket and prints the agent's answer. VERSION is answered
here, without the agent.

Wire contract with the agent (``felix/cni_server/server.py``): the shim writes one JSON
object and shuts down its write side; the agent answers one JSON object,
``{"result": {...}}`` (printed as is; ``null`` for DEL/CHECK/STATUS/GC) or
``{"error": {"code", "msg", "details"}}``, and closes.

Agent unreachable (no socket file, connection refused):

- ADD, CHECK, STATUS and GC fail with code 11 (try again later), naming the
  socket, so the runtime retries once the agent is back.
- DEL **succeeds** (exit 0, warning on stderr), as Multus does. A failing DEL
  keeps the pod sandbox (and the Pod) stuck until the agent returns; a
  succeeding one lets the runtime destroy the netns, which takes the veth and
  the host route with it. Only the IPAM reservation leaks, and the agent
  releases it at start-up and on CNI GC (handles whose attachment is no longer
  valid). If the agent accepted the connection but did not answer in time, DEL
  returns 11: the agent is alive and a retry is cheap because DEL is idempotent.

Error codes, as a runtime reads them: 11 (try again later) is the only code
that invites a retry, so it is used for "the agent is busy, down or went away
mid-call" (an empty or cut-off answer means it died or restarted), and never
for input that can never work: a config over :data:`MAX_MESSAGE` is 7, an
over-long container id or a ``CNI_NETNS`` that is not a network namespace is
4, JSON the decoder cannot handle (even nested 100,000 deep) is 6. Whatever
happens, the plugin prints spec error JSON (:func:`main` has a last-resort
guard) and never a traceback alone.

The agent imports the validation helpers below so that both sides agree on
what a valid call is; keep them free of anything but the standard library.
"""

# The json and socket packages cost ~20 ms of start-up per call (they pull in
# re and enum); their C cores, which they wrap, cost well under 1 ms.
import _json
import _socket as socket
import os
import sys

SUPPORTED_VERSIONS = ("0.3.1", "0.4.0", "1.0.0", "1.1.0")
COMMANDS = ("ADD", "DEL", "CHECK", "VERSION", "STATUS", "GC")
DEFAULT_SOCKET = "/run/tabby/cni.sock"
DEFAULT_TIMEOUT_S = 120.0
CONNECT_TIMEOUT_S = 5.0
MAX_MESSAGE = 16 * 1024 * 1024  # bytes: a request (config + env) or an answer
# Runtimes use 64 hex characters; the handle id "<network>.<id>" must fit the
# 512 of IPAMHandle.spec.handleID and a block's 4096-character attributes.
MAX_CONTAINER_ID = 256
MAX_NETWORK_NAME = 128
_NS_GET_NSTYPE = 0xB703  # ioctl(2) on a namespace fd: its CLONE_NEW* type (Linux 4.11)
_CLONE_NEWNET = 0x40000000

# CNI spec error codes (SPEC.md "Error" section; 100+ are Tabby's own).
ERR_INCOMPATIBLE_VERSION = 1
ERR_UNSUPPORTED_FIELD = 2
ERR_UNKNOWN_CONTAINER = 3
ERR_INVALID_ENV = 4
ERR_IO = 5
ERR_DECODING = 6
ERR_INVALID_CONFIG = 7
ERR_TRY_AGAIN_LATER = 11
ERR_NOT_AVAILABLE = 50
ERR_INTERNAL = 999
ERR_CHECK_FAILED = 100  # Tabby: CHECK found the dataplane not as ADD left it.

K8S_ARGS = ("K8S_POD_NAMESPACE", "K8S_POD_NAME", "K8S_POD_INFRA_CONTAINER_ID", "K8S_POD_UID")
_NEEDS_NETNS = ("ADD", "CHECK")
_NEEDS_CONTAINER = ("ADD", "DEL", "CHECK")
_NAME_EXTRA = "_.-"


class _DecodeContext:
    """The settings ``_json.make_scanner`` reads: those of ``json.loads()``."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = float  # NaN, Infinity, -Infinity, as json.loads accepts them


_scan = _json.make_scanner(_DecodeContext())  # type: ignore[arg-type]
_WS = " \t\n\r"


def loads(raw: bytes | str) -> object:
    """``json.loads`` for one document (ValueError on anything else), without ``re``."""
    text = raw.decode() if isinstance(raw, bytes) else raw
    start = len(text) - len(text.lstrip(_WS))
    try:
        value, end = _scan(text, start)
    except StopIteration as stop:
        raise ValueError(f"expecting a JSON value at char {stop.value}") from None
    except RecursionError:
        raise ValueError("JSON is nested too deeply to decode (over ~1000 levels)") from None
    except Exception:
        # The C scanner can only describe a syntax error if json.decoder is
        # loaded; pay for that import on this error path alone.
        import json

        json.loads(text)  # raises the precise JSONDecodeError
        raise
    if text[end:].strip(_WS):
        raise ValueError(f"extra data at char {end}")
    return value


def _unencodable(value: object) -> object:
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


_encode = _json.make_encoder(  # markers=None: results are trees, never cyclic
    None, _unencodable, _json.encode_basestring_ascii, None, ": ", ", ", False, False, True
)


def dumps(value: object) -> str:
    """``json.dumps`` with its defaults (ASCII, ", " and ": " separators)."""
    return "".join(_encode(value, 0))


class CNIError(Exception):
    """A failure the runtime should see as CNI error JSON with a spec code."""

    def __init__(self, code: int, msg: str, details: str = "") -> None:
        super().__init__(msg)
        self.code = code
        self.msg = msg
        self.details = details

    def to_dict(self, cni_version: str) -> dict:
        """Render the spec error object for *cni_version*."""
        return {
            "cniVersion": cni_version,
            "code": self.code,
            "msg": self.msg,
            "details": self.details,
        }


def _version_tuple(version: str) -> tuple:
    return tuple(int(p) if p.isdigit() else 0 for p in version.split("."))


def version_at_least(version: str, minimum: str) -> bool:
    """Compare dotted CNI versions numerically ("0.10.0" > "0.4.0")."""
    return _version_tuple(version) >= _version_tuple(minimum)


def is_valid_name(value: object) -> bool:
    """The spec's name/container-id grammar: ``^[a-zA-Z0-9][a-zA-Z0-9_.\\-]*$``."""
    if not isinstance(value, str) or not value or not value.isascii():
        return False
    return value[0].isalnum() and all(c.isalnum() or c in _NAME_EXTRA for c in value)


def validate_ifname(ifname: str) -> None:
    """Reject names the kernel would refuse, before anything is allocated."""
    if not ifname:
        raise CNIError(ERR_INVALID_ENV, "CNI_IFNAME is empty")
    if len(ifname.encode()) > 15:
        raise CNIError(ERR_INVALID_ENV, f"CNI_IFNAME {ifname!r} is longer than 15 bytes")
    if ifname in (".", ".."):
        raise CNIError(ERR_INVALID_ENV, f"CNI_IFNAME {ifname!r} is not a valid interface name")
    if any(c in "/:" or c.isspace() for c in ifname):
        raise CNIError(ERR_INVALID_ENV, f"CNI_IFNAME {ifname!r} contains '/', ':' or whitespace")


def parse_cni_args(raw: str) -> dict:
    """Parse ``K=V;K2=V2`` (CNI_ARGS); unknown keys are kept, empty items skipped."""
    args: dict = {}
    for item in raw.split(";"):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise CNIError(ERR_INVALID_ENV, f"CNI_ARGS item {item!r} is not KEY=VALUE")
        args[key.strip()] = value.strip()
    return args


def _shown(value: str, limit: int = 64) -> str:
    """*value* for a message: repr'd and cut, so a 4 KB input is not echoed back."""
    return repr(value) if len(value) <= limit else repr(value[:limit]) + f"... ({len(value)} chars)"


def check_netns(netns: str) -> None:
    """*netns* must be a network namespace file (nsfs), not a file, dir or FIFO.

    Checked before anything is allocated: the agent's ``setns`` would fail with
    a bare OSError on a file and block for ever opening a FIFO. Missing is code
    3 (the container is gone), anything else that is not a netns is code 4.
    """
    try:
        st = os.stat(netns)
    except FileNotFoundError:
        raise CNIError(ERR_UNKNOWN_CONTAINER, f"network namespace {netns} does not exist") from None
    except OSError as exc:
        raise CNIError(ERR_INVALID_ENV, f"CNI_NETNS {netns} cannot be read", str(exc)) from None
    wrong = f"CNI_NETNS {netns} is not a network namespace"
    hint = "expected a netns file such as /var/run/netns/<name> or /proc/<pid>/ns/net"
    if st.st_mode & 0o170000 != 0o100000:  # not S_IFREG: a directory, FIFO, device...
        raise CNIError(ERR_INVALID_ENV, wrong, f"it is not a regular file; {hint}")
    try:
        nsfs = os.stat("/proc/self/ns/net").st_dev
    except OSError:
        nsfs = None  # no /proc: let the ioctl below (or the agent) decide
    if nsfs is not None and st.st_dev != nsfs:
        raise CNIError(ERR_INVALID_ENV, wrong, f"it is an ordinary file; {hint}")
    import fcntl  # built into CPython on Linux distributions; only ADD/CHECK pay for it

    try:
        fd = os.open(netns, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise CNIError(ERR_INVALID_ENV, f"CNI_NETNS {netns} cannot be opened", str(exc)) from None
    try:
        kind = fcntl.ioctl(fd, _NS_GET_NSTYPE)
    except OSError:
        kind = _CLONE_NEWNET if nsfs is not None else 0  # nsfs, type unknown (old kernel)
    finally:
        os.close(fd)
    if kind != _CLONE_NEWNET:
        raise CNIError(ERR_INVALID_ENV, wrong, f"it is another kind of namespace; {hint}")


def _require_env(env: dict, key: str) -> str:
    value = env.get(key, "")
    if not value:
        raise CNIError(ERR_INVALID_ENV, f"required environment variable {key} is not set")
    return value


def validate_env(command: str, env: dict) -> dict:
    """Check the CNI_* variables *command* needs; return the subset to forward."""
    out = {"CNI_COMMAND": command}
    if command in _NEEDS_CONTAINER:
        cid = _require_env(env, "CNI_CONTAINERID")
        if len(cid) > MAX_CONTAINER_ID:
            raise CNIError(
                ERR_INVALID_ENV,
                f"CNI_CONTAINERID is {len(cid)} characters long; at most {MAX_CONTAINER_ID}"
                " are accepted (runtimes use 64)",
                _shown(cid),
            )
        if not is_valid_name(cid):
            raise CNIError(ERR_INVALID_ENV, f"CNI_CONTAINERID {_shown(cid)} has invalid characters")
        out["CNI_CONTAINERID"] = cid
        ifname = _require_env(env, "CNI_IFNAME")
        validate_ifname(ifname)
        out["CNI_IFNAME"] = ifname
    netns = env.get("CNI_NETNS", "")
    if command in _NEEDS_NETNS:
        netns = _require_env(env, "CNI_NETNS")
    if netns and command in _NEEDS_CONTAINER:
        if not netns.startswith("/"):
            raise CNIError(ERR_INVALID_ENV, f"CNI_NETNS {netns!r} is not an absolute path")
        if command in _NEEDS_NETNS:
            check_netns(netns)
        out["CNI_NETNS"] = netns
    if command == "GC":
        out["CNI_PATH"] = _require_env(env, "CNI_PATH")
    elif env.get("CNI_PATH"):
        out["CNI_PATH"] = env["CNI_PATH"]
    out["CNI_ARGS"] = env.get("CNI_ARGS", "")
    return out


def _check_attachments(value: object) -> None:
    if not isinstance(value, list):
        raise CNIError(ERR_INVALID_CONFIG, "cni.dev/attachments must be a list")
    for item in value:
        if not (
            isinstance(item, dict)
            and isinstance(item.get("containerID"), str)
            and isinstance(item.get("ifname"), str)
        ):
            raise CNIError(
                ERR_INVALID_CONFIG,
                "cni.dev/attachments entries need string containerID and ifname",
                dumps(item)[:200],
            )


def _check_optional_fields(config: dict) -> None:
    mtu = config.get("mtu")
    if mtu is not None and (type(mtu) is not int or not 68 <= mtu <= 65535):
        raise CNIError(ERR_INVALID_CONFIG, f"mtu must be an integer in 68..65535, got {mtu!r}")
    sock = config.get("agent_socket")
    if sock is not None and not (isinstance(sock, str) and sock.startswith("/")):
        raise CNIError(ERR_INVALID_CONFIG, f"agent_socket must be an absolute path, got {sock!r}")
    timeout = config.get("agent_timeout_s")
    if timeout is not None and (type(timeout) not in (int, float) or not 0 < timeout <= 3600):
        raise CNIError(
            ERR_INVALID_CONFIG, f"agent_timeout_s must be 0 < seconds <= 3600, got {timeout!r}"
        )
    prev = config.get("prevResult")
    if prev is not None and not isinstance(prev, dict):
        raise CNIError(ERR_INVALID_CONFIG, "prevResult must be an object")
    if "cni.dev/attachments" in config:
        _check_attachments(config["cni.dev/attachments"])


def validate_config(command: str, config: object) -> dict:
    """Check the network configuration's shape; return it unchanged."""
    if not isinstance(config, dict):
        raise CNIError(ERR_DECODING, "network configuration must be a JSON object")
    version = config.get("cniVersion")
    if not isinstance(version, str):
        raise CNIError(ERR_INVALID_CONFIG, "cniVersion is missing or not a string")
    if version not in SUPPORTED_VERSIONS:
        raise CNIError(
            ERR_INCOMPATIBLE_VERSION,
            f"unsupported cniVersion {version!r}",
            "supported: " + ", ".join(SUPPORTED_VERSIONS),
        )
    if command in ("STATUS", "GC") and not version_at_least(version, "1.1.0"):
        raise CNIError(
            ERR_INCOMPATIBLE_VERSION, f"config version {version} does not allow {command}"
        )
    if command == "GC" and "cni.dev/attachments" not in config:
        # Without the list every attachment would look stale: refuse, never wipe.
        raise CNIError(ERR_INVALID_CONFIG, "GC needs cni.dev/attachments (the valid attachments)")
    if not is_valid_name(config.get("name")):
        raise CNIError(ERR_INVALID_CONFIG, "network name is missing or invalid")
    if len(config["name"]) > MAX_NETWORK_NAME:
        raise CNIError(
            ERR_INVALID_CONFIG, f"network name is longer than {MAX_NETWORK_NAME} characters"
        )
    if not isinstance(config.get("type"), str) or not config["type"]:
        raise CNIError(ERR_INVALID_CONFIG, "plugin type is missing or not a string")
    _check_optional_fields(config)
    return config


def decode_config(raw: bytes) -> object:
    """Decode stdin; a decoding failure is spec code 6."""
    try:
        return loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CNIError(ERR_DECODING, "failed to decode network configuration", str(exc)) from None


def build_request(command: str, env: dict, raw_config: bytes) -> dict:
    """Validate the whole call and build the message for the agent."""
    if not command:
        raise CNIError(ERR_INVALID_ENV, "required environment variable CNI_COMMAND is not set")
    if command not in COMMANDS:
        raise CNIError(ERR_INVALID_ENV, f"unknown CNI_COMMAND {command!r}")
    config = validate_config(command, decode_config(raw_config))
    sub_env = validate_env(command, env)
    args = parse_cni_args(sub_env["CNI_ARGS"])
    return {"command": command, "env": sub_env, "args": args, "config": config}


def caller_version(raw_config: bytes) -> str:
    """The caller's cniVersion if we speak it, else our newest (for answers and errors).

    Never raises: it runs on the error path too.
    """
    if len(raw_config) > MAX_MESSAGE:
        return SUPPORTED_VERSIONS[-1]
    try:
        config = loads(raw_config)
        requested = config.get("cniVersion") if isinstance(config, dict) else None
    except Exception:
        requested = None
    return requested if requested in SUPPORTED_VERSIONS else SUPPORTED_VERSIONS[-1]


def version_result(raw_config: bytes) -> dict:
    """Answer VERSION without the agent; an unreadable stdin is not an error."""
    return {"cniVersion": caller_version(raw_config), "supportedVersions": list(SUPPORTED_VERSIONS)}


def _recv_all(sock: socket.socket) -> bytes:
    chunks: list = []
    size = 0
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > MAX_MESSAGE:
            raise CNIError(ERR_INTERNAL, "agent answer is too large")
        chunks.append(chunk)


class AgentUnreachable(Exception):
    """No agent listening: the socket is missing or refuses connections."""


def _too_large(size: int, what: str) -> CNIError:
    return CNIError(
        ERR_INVALID_CONFIG,
        f"{what} is too large: {size} bytes, over the 16 MiB limit"
        f" ({MAX_MESSAGE} bytes) of a request to the tabby agent",
    )


def _decode_answer(path: str, raw: bytes) -> dict:
    """The agent's answer; an empty or cut-off one means it died mid-call (code 11)."""
    if not raw.strip():
        raise CNIError(
            ERR_TRY_AGAIN_LATER,
            f"tabby agent on {path} closed the connection without answering"
            " (it may have been restarted); try again",
        )
    try:
        answer = loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        if not raw.rstrip().endswith(b"}"):  # the agent writes one object: this one was cut
            raise CNIError(
                ERR_TRY_AGAIN_LATER,
                f"tabby agent on {path} hung up without finishing its answer"
                f" ({len(raw)} bytes; it may have been restarted); try again",
                str(exc),
            ) from None
        raise CNIError(
            ERR_INTERNAL, f"tabby agent on {path} sent an undecodable answer", str(exc)
        ) from None
    if not isinstance(answer, dict):
        raise CNIError(ERR_INTERNAL, f"tabby agent on {path} sent a malformed answer")
    return answer


def call_agent(path: str, request: dict, timeout: float) -> dict:
    """Send one request, read one answer; errors are CNIError or AgentUnreachable."""
    data = dumps(request).encode()
    if len(data) > MAX_MESSAGE:  # the agent would drop it unanswered: say why, for good
        raise _too_large(len(data), "the request (network configuration and CNI_* environment)")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        # Blocking connect waits for room in a busy agent's backlog, bounded by
        # SO_SNDTIMEO (a struct timeval); settimeout() would fail at once with EAGAIN.
        timeval = int(CONNECT_TIMEOUT_S).to_bytes(8, sys.byteorder) + bytes(8)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)
        try:
            sock.connect(path)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            raise AgentUnreachable(f"tabby agent socket {path}: {exc}") from None
        except OSError as exc:  # e.g. a full backlog: the agent lives but is busy
            raise CNIError(
                ERR_TRY_AGAIN_LATER, f"tabby agent on {path} did not accept", str(exc)
            ) from None
        sock.settimeout(timeout)
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
            raw = _recv_all(sock)
        except OSError as exc:
            raise CNIError(
                ERR_TRY_AGAIN_LATER,
                f"no answer from the tabby agent on {path} (busy or restarting?); try again",
                str(exc),
            ) from None
    finally:
        sock.close()
    return _decode_answer(path, raw)


def _answer(answer: dict) -> object:
    error = answer.get("error")
    if isinstance(error, dict):
        raise CNIError(
            int(error.get("code", ERR_INTERNAL)),
            str(error.get("msg", "agent error")),
            str(error.get("details", "")),
        )
    return answer.get("result")


def forward(request: dict) -> object:
    """Forward a validated request; map an absent agent per the module docstring."""
    config = request["config"]
    path = config.get("agent_socket") or DEFAULT_SOCKET
    timeout = float(config.get("agent_timeout_s") or DEFAULT_TIMEOUT_S)
    try:
        return _answer(call_agent(path, request, timeout))
    except AgentUnreachable as exc:
        if request["command"] == "DEL":
            sys.stderr.write(f"tabby: {exc}; DEL treated as done, GC releases the address\n")
            return None
        raise CNIError(
            ERR_TRY_AGAIN_LATER,
            f"tabby agent is not reachable on {path}; is the node agent running?",
            str(exc),
        ) from None


def run(env: dict, raw_config: bytes) -> tuple:
    """Handle one call; return (exit code, stdout text)."""
    command = env.get("CNI_COMMAND", "")
    if command == "VERSION":
        return 0, dumps(version_result(raw_config))
    try:
        if len(raw_config) > MAX_MESSAGE:
            raise _too_large(len(raw_config), "the network configuration on stdin")
        result = forward(build_request(command, env, raw_config))
    except CNIError as exc:
        return 1, dumps(exc.to_dict(caller_version(raw_config)))
    except Exception as exc:  # the runtime must always get spec JSON
        error = CNIError(ERR_INTERNAL, "tabby shim failed", repr(exc))
        return 1, dumps(error.to_dict(caller_version(raw_config)))
    if result is None:
        return 0, ""
    return 0, dumps(result)


def read_stdin() -> bytes:
    """All of stdin up to MAX_MESSAGE + 1 bytes; the rest is read and dropped.

    Reading it all keeps the runtime's write from failing (EPIPE) and memory
    bounded; one byte over the limit is enough for :func:`run` to refuse it.
    """
    read = sys.stdin.buffer.read
    raw = read(MAX_MESSAGE + 1)
    while len(raw) > MAX_MESSAGE and read(1 << 20):
        pass
    return raw


def _last_resort(exc: BaseException) -> str:
    """Error JSON built from literals: nothing here may fail in turn."""
    details = _json.encode_basestring_ascii(f"{type(exc).__name__}: {exc}"[:500])
    return (
        f'{{"cniVersion": "{SUPPORTED_VERSIONS[-1]}", "code": {ERR_INTERNAL}, '
        f'"msg": "tabby shim failed unexpectedly", "details": {details}}}'
    )


def main() -> int:
    """Entry point: env and stdin in, JSON and exit status out.

    The guard makes sure the runtime gets spec error JSON whatever goes wrong.
    """
    try:
        raw = b""
        if os.environ.get("CNI_COMMAND") != "VERSION" or not sys.stdin.isatty():
            raw = read_stdin()
        code, text = run(dict(os.environ), raw)
    except BaseException as exc:  # the runtime must always get JSON
        code, text = 1, _last_resort(exc)
    if text:
        sys.stdout.write(text + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
