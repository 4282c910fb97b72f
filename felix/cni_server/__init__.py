"""The node agent's side of the CNI contract: a unix-socket server and its handlers.

``cni/shim.py`` forwards every CNI call here as one JSON message; this module
validates it again (with the shim's own validators), runs the handler and
answers ``{"result": ...}`` or ``{"error": {code, msg, details}}``.

Contract per command:

- **ADD** answers only after, in order: the agent is ready (else code 11), the
  address is assigned to handle ``<network>.<containerID>`` (idempotent, so a
  repeated ADD gets the same address), the veth/addresses/routes/sysctls are
  wired (:mod:`felix.wiring`), the endpoint is in :attr:`CNIHandlers.endpoints`,
  the ``on_endpoint_added`` hook has returned and the Pod is annotated
  (``tabby.dev/podIP``, ``tabby.dev/containerID``; that apiserver write runs
  beside the hook, both are waited for). The hook is where the policy
  dataplane plugs in: it should return once the endpoint's chains are
  programmed, so a pod never sends a packet before its policy exists. Any
  failure rolls back the host veth and the address (also those of an earlier
  identical ADD: the runtime follows a failed ADD with DEL anyway).
- **DEL** never needs the agent to be synced; it removes the veth (inside the
  pod netns; by host name only if this container still owns it), releases the
  handle and clears the Pod's podIP annotation. Missing pieces are fine.
- **CHECK** compares the kernel with what ADD built and names each difference
  (code 100); an unknown container is code 3.
- **STATUS** is code 50 until :meth:`CNIHandlers.set_synced` and the allocator
  says a pool can serve.
- **GC** releases every handle and endpoint of this network whose container is
  not in ``cni.dev/attachments``; it carries on past errors and reports them.

Calls for one container id are serialized; different containers run in
parallel (one thread per connection).

**Restart after a crash** (SIGKILL, OOM): an ADD cut off mid-way cannot roll
itself back, and its caller saw a failure. With an :class:`AddJournal`, every
ADD leaves a marker for as long as it runs (removed just before the answer is
sent), and every answered ADD leaves a record of its endpoint until its DEL.
:func:`recover_after_restart`, run at start-up before the socket serves, undoes
every ADD still marked, re-adopts each recorded endpoint whose owner is alive
(sandbox netns present, Pod not gone), frees the others, and deletes ``cali``
veths nobody owns. A pod whose route was deleted keeps its veth and address:
routes, sysctls and veth state are desired state that :meth:`CNIHandlers.repair`
(the agent's periodic resync) puts back.

One host veth per container: an ADD for a second ``CNI_IFNAME`` of a wired
container is refused (code 4) rather than taking over the first's veth.

Rooms (one module each):

- :mod:`cni.vocabulary` (beside the shim, standard library only): handle ids,
  annotation keys, the Pod of a call's ``CNI_ARGS``; shared with the agent and
  the tools.
- :mod:`~felix.cni_server.request`: a validated call (:class:`CNIRequest`).
- :mod:`~felix.cni_server.endpoints`: :class:`Endpoint`, the one
  :class:`EndpointTable` of wired attachments, and what IPAM must offer.
- :mod:`~felix.cni_server.journal`: markers of ADDs in flight and records of
  answered ones (:class:`AddJournal`).
- :mod:`~felix.cni_server.handlers`: the commands (:class:`CNIHandlers`).
- :mod:`~felix.cni_server.recovery`: :func:`recover_after_restart`.
- :mod:`~felix.cni_server.server`: the socket server (:class:`CNIServer`) and
  ``python -m felix.cni_server``.
"""

from cni.vocabulary import (
    ANNOTATION_CONTAINER_ID,
    ANNOTATION_POD_IP,
    PodRef,
    handle_id,
    pod_of,
)
from felix.cni_server.endpoints import (
    AddressAllocator,
    Endpoint,
    EndpointTable,
    Holding,
    PodKey,
)
from felix.cni_server.handlers import CNIHandlers, PhaseClock
from felix.cni_server.journal import AddJournal, PendingAdd, PendingDel
from felix.cni_server.recovery import RecoveryReport, recover_after_restart
from felix.cni_server.request import CNIRequest, parse_request
from felix.cni_server.server import CNIServer, answer

__all__ = [
    "ANNOTATION_CONTAINER_ID",
    "ANNOTATION_POD_IP",
    "AddJournal",
    "AddressAllocator",
    "CNIHandlers",
    "CNIRequest",
    "CNIServer",
    "Endpoint",
    "EndpointTable",
    "Holding",
    "PendingAdd",
    "PendingDel",
    "PhaseClock",
    "PodKey",
    "PodRef",
    "RecoveryReport",
    "answer",
    "handle_id",
    "parse_request",
    "pod_of",
    "recover_after_restart",
]
