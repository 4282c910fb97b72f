"""tabbyctl: inspect and operate a Tabby cluster.

Subcommand groups live in their own modules and are attached here, so each area
(ipam, node, policy, lab, ...) can grow without touching the others.
"""

from __future__ import annotations

import importlib
import logging
import os

import click

from datastore.client import Datastore
from datastore.errors import NotConfigured
from datastore.incluster import choose_kubeconfig
from tabbyctl.output import CliError

DEFAULT_KUBECONFIG = os.path.expanduser("~/.kube/config")

# module path -> attribute holding a click command or group
SUBCOMMANDS: dict[str, str] = {
    "ipam": "tabbyctl.ipam:ipam",
    "node": "tabbyctl.node:node",
    "cni": "tabbyctl.cni:cni",
    "lab": "tabbyctl.lab:lab",
    "policy": "tabbyctl.policy:policy",
    "endpoints": "tabbyctl.cni:endpoints",
    "diagnose": "tabbyctl.diagnose:diagnose",
}


class Context:
    """Shared state for subcommands: where the datastore is.

    kubeconfig is the --kubeconfig flag; None chooses as kubectl does ($KUBECONFIG,
    ~/.kube/config, then the pod's ServiceAccount), when a subcommand first needs it.
    """

    def __init__(self, kubeconfig: str | None = None) -> None:
        self.kubeconfig = kubeconfig
        self._datastore: Datastore | None = None

    @property
    def datastore(self) -> Datastore:
        if self._datastore is None:
            try:
                chosen = choose_kubeconfig(self.kubeconfig, home_default=DEFAULT_KUBECONFIG)
                self._datastore = Datastore.connect(chosen)
            except NotConfigured as exc:
                raise CliError(str(exc)) from None
        return self._datastore


@click.group()
@click.option(
    "--kubeconfig",
    default=None,
    help="Kubeconfig of the cluster (the lab writes one: see `tabbyctl lab status`). "
    "Default: $KUBECONFIG, then ~/.kube/config, then the pod's ServiceAccount.",
)
@click.option("-v", "--verbose", is_flag=True, help="Debug logging on stderr.")
@click.pass_context
def cli(ctx: click.Context, kubeconfig: str | None, verbose: bool) -> None:
    """Inspect and operate Tabby: routed pod networking for Kubernetes."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING)
    if ctx.obj is None:  # tests pass a Context of their own
        ctx.obj = Context(kubeconfig)


def _attach_subcommands() -> None:
    for name, target in SUBCOMMANDS.items():
        module_name, attr = target.split(":")
        module = importlib.import_module(module_name)
        cli.add_command(getattr(module, attr), name=name)


_attach_subcommands()


if __name__ == "__main__":
    cli()
