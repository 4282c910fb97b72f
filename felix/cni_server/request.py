"""A CNI call as the agent sees it, validated again on arrival (the shim's
validators: the socket is root-only but not trusted blindly)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cni.shim import (
    COMMANDS,
    ERR_DECODING,
    ERR_INVALID_ENV,
    CNIError,
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


def parse_request(message: object) -> CNIRequest:
    """Re-validate what the shim sent; the socket is root-only but not trusted blindly."""
    if not isinstance(message, dict):
        raise CNIError(ERR_DECODING, "request must be a JSON object")
    command = message.get("command")
    env = message.get("env")
    if command not in COMMANDS or not isinstance(env, dict):
        raise CNIError(ERR_INVALID_ENV, f"request has no valid command/env (command={command!r})")
    config = validate_config(str(command), message.get("config"))
    clean_env = validate_env(str(command), {str(k): str(v) for k, v in env.items()})
    args = parse_cni_args(clean_env.get("CNI_ARGS", ""))
    return CNIRequest(str(command), clean_env, args, config)
