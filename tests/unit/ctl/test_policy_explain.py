"""`tabbyctl policy explain` over an in-memory apiserver."""

from __future__ import annotations

import json
from typing import Any

from click.testing import CliRunner

from datastore import kinds
from datastore.client import Datastore
from datastore.memory import MemoryTransport
from tabbyctl.main import Context, cli


def _world() -> Context:
    ds = Datastore(MemoryTransport())
    for ns in ("x", "y"):
        ds.create_raw(
            kinds.NAMESPACE,
            {"metadata": {"name": ns, "labels": {"kubernetes.io/metadata.name": ns}}},
        )
    for ns, name, ip in (("x", "a", "10.244.0.1"), ("y", "b", "10.244.0.2")):
        ds.create_raw(
            kinds.POD,
            {
                "metadata": {"name": name, "namespace": ns, "labels": {"pod": name}},
                "spec": {
                    "containers": [
                        {
                            "name": "c",
                            "ports": [{"name": "http", "containerPort": 80, "protocol": "TCP"}],
                        }
                    ]
                },
                "status": {"podIP": ip},
            },
        )
    ds.create_raw(
        kinds.NETWORKPOLICY,
        {
            "metadata": {"name": "only-a", "namespace": "y"},
            "spec": {
                "podSelector": {"matchLabels": {"pod": "b"}},
                "ingress": [
                    {
                        "from": [
                            {
                                "namespaceSelector": {
                                    "matchLabels": {"kubernetes.io/metadata.name": "x"}
                                }
                            }
                        ],
                        "ports": [{"port": "http"}],
                    }
                ],
            },
        },
    )
    ctx = Context("unused")
    ctx._datastore = ds
    return ctx


def _explain(ctx: Context, *args: str) -> tuple[int, Any]:
    result = CliRunner().invoke(cli, ["policy", "explain", *args, "-o", "json"], obj=ctx)
    return result.exit_code, (json.loads(result.output) if result.exit_code == 0 else result.output)


def test_named_port_allowed_from_the_selected_namespace_and_denied_elsewhere() -> None:
    ctx = _world()
    code, out = _explain(ctx, "--from", "x/a", "--to", "y/b", "--port", "80/TCP")
    assert code == 0 and out["allowed"] is True
    ingress = next(d for d in out["directions"] if d["direction"] == "ingress")
    assert ingress["decided_by"] == "y/only-a" and "ingress[0]" in ingress["reason"]
    code, out = _explain(ctx, "--from", "x/a", "--to", "y/b", "--port", "81/TCP")
    assert out["allowed"] is False
    # the reverse direction is not isolated by any policy: the default applies
    code, out = _explain(ctx, "--from", "y/b", "--to", "x/a", "--port", "80/TCP")
    assert out["allowed"] is True
    assert {d["decided_by"] for d in out["directions"]} == {"default (not isolated)"}


def test_bad_input_is_a_clear_error() -> None:
    ctx = _world()
    code, out = _explain(ctx, "--from", "x/a", "--to", "y/b", "--port", "http")
    assert code == 2 and "PORT" in out
    code, out = _explain(ctx, "--from", "x/nope", "--to", "y/b", "--port", "80")
    assert code == 2 and "x/nope not found" in out
