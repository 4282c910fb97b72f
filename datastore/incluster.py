"""Which cluster to talk to: a kubeconfig, or the pod's own ServiceAccount.

The order is kubectl's and client-go's: an explicit --kubeconfig, then $KUBECONFIG,
then (tabbyctl only) ~/.kube/config, then the in-cluster configuration kubelet gives
every pod: $KUBERNETES_SERVICE_HOST/PORT and the ServiceAccount mount (token, ca.crt).
Anything else is a NotConfigured error that says what was looked for.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from datastore.errors import NotConfigured

# Where kubelet mounts the pod's ServiceAccount token (projected, rotated) and the CA.
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
HOST_ENV = "KUBERNETES_SERVICE_HOST"
PORT_ENV = "KUBERNETES_SERVICE_PORT"


def service_account_dir(directory: Path | None = None) -> Path:
    """The mount to read; looked up at call time so tests can point it elsewhere."""
    return directory if directory is not None else SERVICE_ACCOUNT_DIR


def server_url(host: str, port: str) -> str:
    """https://host:port, an IPv6 host in brackets (as net.JoinHostPort writes it)."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"https://{host}:{port}"


def in_cluster_problems(directory: Path, environ: Mapping[str, str]) -> list[str]:
    """What the in-cluster configuration lacks here; empty when it is complete."""
    problems = [f"${name} is not set" for name in (HOST_ENV, PORT_ENV) if not environ.get(name)]
    problems += [
        f"{directory / name} does not exist"
        for name in ("token", "ca.crt")
        if not (directory / name).is_file()
    ]
    return problems


def choose_kubeconfig(
    flag: str | None,
    environ: Mapping[str, str] | None = None,
    *,
    home_default: str | None = None,
    directory: Path | None = None,
) -> str | None:
    """The kubeconfig to load, or None for the in-cluster ServiceAccount.

    Raises NotConfigured when there is neither. An explicit path is returned even when
    the file is missing: loading it then fails naming the file (kubectl does the same).
    """
    env = os.environ if environ is None else environ
    if flag:
        return flag
    from_env = _kubeconfig_env(env.get("KUBECONFIG", ""))
    if from_env:
        return from_env
    if home_default and Path(home_default).is_file():
        return home_default
    sa_dir = service_account_dir(directory)
    problems = in_cluster_problems(sa_dir, env)
    if not problems:
        return None
    looked = ["--kubeconfig not given", "$KUBECONFIG not set"]
    if home_default:
        looked.append(f"{home_default} not found")
    raise NotConfigured(
        "no kubeconfig and not in a cluster: "
        + ", ".join(looked)
        + "; in-cluster ServiceAccount: "
        + ", ".join(problems)
    )


def _kubeconfig_env(value: str) -> str | None:
    """$KUBECONFIG's file: the first that exists of a list (kubectl merges; Tabby reads one)."""
    paths = [p for p in value.split(os.pathsep) if p]
    if not paths:
        return None
    return next((p for p in paths if Path(p).is_file()), paths[0])
