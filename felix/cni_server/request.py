"""A CNI call as the agent sees it, validated on arrival with the shim's validators
(the socket is root-only but not trusted blindly).

Two senders, two forms of one message:

- the node's static forwarder (``cni/forwarder``, what nodes run): ``{"command",
  "env" (every CNI_* variable), "stdin" (the network configuration as sent, or
  "stdin_base64" when it is not UTF-8)}``, unexamined: the whole validation of the
  call (:func:`cni.shim.build_request`) happens here;
- the Python shim (``cni/shim.py``): ``{"command", "env", "args", "config"}``,
  already validated by the shim, validated again.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

from cni.shim import (
    COMMANDS,
    ERR_DECODING,
    ERR_INVALID_ENV,
    CNIError,
    build_request,
    parse_cni_args,
    validate_config,
    validate_env,
)
from cni.vocabulary import PodRef, handle_id, pod_of
from felix.events import sanitize


@dataclass(frozen=True)
class CNIRequest:
    """A validated call as the agent sees it."""

    command: str
    env: dict[str, str]
    args: dict[str, str]
    config: dict[str, Any]

    @property
    def container_id(self) -> str:
        return self.env.get("CNI_CONTAINERID", "")

    @property
    def ifname(self) -> str:
        return self.env.get("CNI_IFNAME", "")

    @property
    def netns(self) -> str:
        return self.env.get("CNI_NETNS", "")

    @property
    def network(self) -> str:
        return str(self.config["name"])

    @property
    def version(self) -> str:
        return str(self.config["cniVersion"])

    @property
    def handle_id(self) -> str:
        return handle_id(self.network, self.container_id)

    @property
    def pod(self) -> PodRef:
        """The Pod the runtime names in ``CNI_ARGS`` (empty fields where it does not)."""
        return pod_of(self.args)


def short(text: str, limit: int = 16) -> str:
    """A user-supplied string fit for a message, log line or Event (see felix.events)."""
    return sanitize(text, limit)


def forwarded_stdin(message: object) -> bytes | None:
    """The network configuration of a forwarder's message as the runtime sent it; None
    for the shim's form. A ``stdin_base64`` that is not base64 is code 6."""
    if not isinstance(message, dict):
        return None
    if isinstance(message.get("stdin"), str):
        return str(message["stdin"]).encode("utf-8", "surrogatepass")
    encoded = message.get("stdin_base64")
    if encoded is None:
        return None
    if not isinstance(encoded, str):
        raise CNIError(ERR_DECODING, "stdin_base64 is not base64", "not a string")
    try:
        return base64.b64decode(encoded, validate=True)
    except ValueError as exc:  # binascii.Error, or a non-ASCII character
        raise CNIError(ERR_DECODING, "stdin_base64 is not base64", str(exc)) from None


def parse_request(message: object) -> CNIRequest:
    """Validate a forwarder's call, or re-validate what the shim sent."""
    if not isinstance(message, dict):
        raise CNIError(ERR_DECODING, "request must be a JSON object")
    raw = forwarded_stdin(message)
    if raw is not None:
        env = message.get("env")
        if not isinstance(env, dict):
            raise CNIError(ERR_INVALID_ENV, "request has no env object")
        call = build_request(str(message.get("command") or ""), _strings(env), raw)
        return CNIRequest(call["command"], call["env"], call["args"], call["config"])
    command = message.get("command")
    env = message.get("env")
    if command not in COMMANDS or not isinstance(env, dict):
        raise CNIError(ERR_INVALID_ENV, f"request has no valid command/env (command={command!r})")
    config = validate_config(str(command), message.get("config"))
    clean_env = validate_env(str(command), {str(k): str(v) for k, v in env.items()})
    args = parse_cni_args(clean_env.get("CNI_ARGS", ""))
    return CNIRequest(str(command), clean_env, args, config)


def _strings(env: dict[object, object]) -> dict[str, str]:
    return {str(k): str(v) for k, v in env.items()}
