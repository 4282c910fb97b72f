"""Read Tabby's rule hashes from a legacy iptables table through libiptc.

python-iptables acts on the network namespace of the *calling process*, so the
agent never imports it: it runs ``python .../legacy_helper.py <table>`` (by
path, so it needs no installed package, and it imports nothing from Tabby)
through its :class:`~felix.dataplane.runner.CommandRunner`, which
puts the helper in the right namespace (``ip netns exec`` in tests). The
helper prints the same view ``parse_save`` builds from iptables-save output,
as JSON: ``{chain: [hash or null, ...]}``.
"""

from __future__ import annotations

import json
import sys

HASH_PREFIX = "tby:"  # the same as felix.dataplane.iptables.HASH_PREFIX (kept import-free)


def read_hashes(table_name: str, *, ipv6: bool = False) -> dict[str, list[str | None]]:
    """Per chain, per rule: the hash from a ``tby:`` comment, or None."""
    import iptc

    table = iptc.Table6(table_name) if ipv6 else iptc.Table(table_name)
    table.refresh()
    view: dict[str, list[str | None]] = {}
    for chain in table.chains:
        view[chain.name] = [_rule_hash(rule) for rule in chain.rules]
    return view


def _rule_hash(rule: object) -> str | None:
    for match in getattr(rule, "matches", []):
        if match.name != "comment":
            continue
        # get_all_parameters, not .parameters: the latter cuts values at "--".
        values = match.get_all_parameters().get("comment", [])
        comment = " ".join(values).strip('"')
        if comment.startswith(HASH_PREFIX):
            return comment[len(HASH_PREFIX) :]
    return None


def main(argv: list[str]) -> int:
    ipv6 = "--ipv6" in argv
    args = [a for a in argv if a != "--ipv6"]
    if len(args) != 1:
        print("usage: legacy_helper.py [--ipv6] <table>", file=sys.stderr)
        return 2
    try:
        view = read_hashes(args[0], ipv6=ipv6)
    except Exception as exc:  # libiptc raises its own error types; report, do not trace
        print(f"reading table {args[0]} through libiptc failed: {exc}", file=sys.stderr)
        return 1
    json.dump(view, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
