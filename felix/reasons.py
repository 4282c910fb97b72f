"""Why the agent runs a dataplane pass: the reasons besides informer names
(``pods``, ``policies``, ``blocks``, ...) that passes and managers agree on."""

from __future__ import annotations

ENDPOINT_ADDED = "endpoint-added"  # the pass a CNI ADD waits for (policy only)
ENDPOINT_REMOVED = "endpoint-removed"  # prefix: "endpoint-removed:<host veth>"
# An ADD's pass leaves status.json to the loop: writing it took 1.4 ms of every ADD,
# and passes that end together need one write, not one each.
STATUS_STALE = "status-stale"
PERIODIC_RESYNC = "periodic-resync"  # the loop's timer (felix.loop)
