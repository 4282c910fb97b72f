"""ExaBGP's own `exabgp` command, with one repair: a reload is never dropped.

ExaBGP 5.0 (reactor/loop.py) checks, when SIGUSR1 arrives, whether any active peer
still has routes queued in its adj-rib-out; if one has, it re-arms the signal and
skips the reload, so the reload is lost, not deferred. A peer that is down and
dialling (an external peer with a wrong password, a ToR that is away) keeps every
route Tabby announced to it queued until it comes up, so while such a peer exists
no configuration change took effect: measured in
tests/integration/bgp/test_bgp_passwords.py, the fixed password was never used and
the session stayed down. The same could drop a reload that coincided with a burst
of updates to a healthy peer.

The check protects routes written in the configuration file, which a reload diffs;
Tabby writes none (every route goes through the API), so the reload may always
proceed: queued API routes stay queued and are sent when their session is up.
"""

from __future__ import annotations

import sys

from exabgp.application.main import main
from exabgp.reactor.loop import Reactor


def _never_pending(reactor: Reactor) -> bool:
    """Tabby's configuration carries no routes: nothing a reload must wait for."""
    del reactor
    return False


def run() -> int:
    Reactor._pending_adjribout = _never_pending
    sys.argv[0] = "exabgp"
    return int(main() or 0)


if __name__ == "__main__":
    sys.exit(run())
