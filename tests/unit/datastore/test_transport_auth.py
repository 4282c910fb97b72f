"""Which credentials HttpTransport sends for each kind of kubeconfig user."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from datastore.transport import HttpTransport


def kubeconfig(tmp_path: Path, user: dict[str, Any]) -> str:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443"}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def authorization(transport: HttpTransport) -> str | None:
    return transport._auth_headers().get("Authorization")


def test_inline_token_is_sent_as_bearer(tmp_path: Path) -> None:
    transport = HttpTransport.from_kubeconfig(kubeconfig(tmp_path, {"token": "abc.def"}))
    assert authorization(transport) == "Bearer abc.def"


def test_token_file_is_relative_to_the_kubeconfig_and_reread_when_rotated(
    tmp_path: Path,
) -> None:
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("first\n")
    transport = HttpTransport.from_kubeconfig(kubeconfig(tmp_path, {"tokenFile": "sa/token"}))
    assert authorization(transport) == "Bearer first"
    # kubelet's rotation: a new file moved into place
    (sa / "token.new").write_text("second")
    os.replace(sa / "token.new", sa / "token")
    assert authorization(transport) == "Bearer second"


def test_client_certificate_user_sends_no_token(tmp_path: Path) -> None:
    for name in ("c.crt", "c.key"):
        (tmp_path / name).write_text("not read until a connection is made\n")
    user = {"client-certificate": str(tmp_path / "c.crt"), "client-key": str(tmp_path / "c.key")}
    transport = HttpTransport.from_kubeconfig(kubeconfig(tmp_path, user))
    assert authorization(transport) is None
