"""Which addresses a Pod stands for in policy: only ones kubelet or Tabby vouch for.

A selector's ipset holds the addresses of the pods it matches, so whatever says
which address is a pod's says who gets through. Anyone allowed to create a Pod
writes its labels, annotations and spec (``nodeName`` and ``hostNetwork``
included); only kubelet writes its status (the apiserver drops ``status`` on a
Pod's create and update, it is changed through ``pods/status``), and only Tabby
writes IPAM blocks and its own endpoint table. So a pod's addresses are, in
this order:

1. none for a hostNetwork pod (its status address is its node's) and none for
   a finished one (phase Succeeded or Failed);
2. the address this node's agent wired for it (its CNI endpoint table, keyed by
   the runtime's ``K8S_POD_NAMESPACE``/``K8S_POD_NAME``): known before kubelet
   writes the status, so a local pod is protected and selected from its ADD on;
3. ``status.podIPs`` / ``status.podIP``, minus every address IPAM records for a
   different pod (a stale status whose address was freed and given to another),
   and, for a terminating pod, minus what IPAM no longer holds for it;
4. with no status address yet: the addresses IPAM allocated to this pod
   (namespace and name, on the node the pod is bound to, the same UID where
   the allocation records one), so remote pods are selected before kubelet
   reports them.

Never from an annotation: ``tabby.dev/podIP`` is written by Tabby for people and
tools, but any user who may patch the Pod may write it too.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from policy.errors import PolicyError
from policy.model import IPAddress, Pod, parse_pod

FINISHED_PHASES = ("Succeeded", "Failed")


@dataclass(frozen=True)
class Owner:
    """Whom IPAM allocated an address to: the attributes stored with the address."""

    namespace: str
    pod: str
    node: str = ""
    uid: str = ""  # empty where the allocation does not record the Pod's UID
    ifname: str = ""  # the pod's interface (CNI_IFNAME) the address was given for

    def is_pod(self, namespace: str, name: str, uid: str) -> bool:
        """The same Pod: namespace and name, and the UID where both sides know it."""
        same_uid = not self.uid or not uid or self.uid == uid
        return self.namespace == namespace and self.pod == name and same_uid


@dataclass(frozen=True)
class LocalAddress:
    """The address this node's agent wired for a pod (from its CNI endpoint table)."""

    address: IPAddress
    uid: str = ""  # K8S_POD_UID of the ADD, where the runtime sent it


class AddressBook:
    """Who IPAM says holds each pod address, and each pod's addresses."""

    def __init__(self, entries: Iterable[tuple[IPAddress, Owner]] = ()) -> None:
        self._owner: dict[IPAddress, Owner] = {}
        self._by_pod: dict[tuple[str, str], list[tuple[IPAddress, Owner]]] = {}
        for ip, owner in entries:
            self._owner[ip] = owner
            self._by_pod.setdefault((owner.namespace, owner.pod), []).append((ip, owner))

    def owner(self, ip: IPAddress) -> Owner | None:
        """The pod IPAM allocated *ip* to, if any."""
        return self._owner.get(ip)

    def owners(self) -> Mapping[IPAddress, Owner]:
        """Every address IPAM gave a pod, and to whom (read only)."""
        return self._owner

    def of_pod(self, namespace: str, name: str) -> list[tuple[IPAddress, Owner]]:
        """Every address IPAM allocated to a pod of this namespace and name."""
        return list(self._by_pod.get((namespace, name), ()))


@dataclass(frozen=True)
class PodFacts:
    """What membership needs of a Pod beyond :class:`policy.Pod`."""

    uid: str
    node: str  # spec.nodeName: empty while the pod is not bound to a node
    terminating: bool  # metadata.deletionTimestamp is set
    finished: bool  # status.phase is Succeeded or Failed


def pod_facts(obj: dict[str, Any]) -> PodFacts:
    """The Pod's UID, node, deletion and phase; PolicyError if they are mistyped."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    uid = _string(meta, "uid", "metadata.uid")
    node = _string(spec, "nodeName", "spec.nodeName")
    phase = _string(status, "phase", "status.phase")
    terminating = meta.get("deletionTimestamp") is not None
    return PodFacts(uid, node, terminating, phase in FINISHED_PHASES)


def _string(obj: Any, key: str, path: str) -> str:
    value = obj.get(key) if isinstance(obj, dict) else None
    if value is None:
        return ""
    if not isinstance(value, str):
        raise PolicyError("must be of type string", path=path)
    return value


def member_ips(
    pod: Pod, facts: PodFacts, book: AddressBook, local: LocalAddress | None = None
) -> tuple[IPAddress, ...]:
    """The pod's addresses for selectors and anti-spoofing (rules in the module doc).

    ``pod.ips`` must come from the status only (:func:`policy.parse_pod`).
    """
    if pod.host_network or facts.finished:
        return ()
    if local is not None and (not local.uid or not facts.uid or local.uid == facts.uid):
        return (local.address,)
    if pod.ips:
        return tuple(ip for ip in pod.ips if _status_ip_holds(pod, facts, book, ip))
    if not facts.node:
        return ()  # never bound to a node, so never wired: nothing to vouch for
    return tuple(
        ip
        for ip, owner in book.of_pod(pod.namespace, pod.name)
        if owner.node == facts.node and owner.is_pod(pod.namespace, pod.name, facts.uid)
    )


def _status_ip_holds(pod: Pod, facts: PodFacts, book: AddressBook, ip: IPAddress) -> bool:
    """A status address is the pod's unless IPAM gave it to another pod meanwhile."""
    owner = book.owner(ip)
    if owner is None:
        return not facts.terminating
    return owner.is_pod(pod.namespace, pod.name, facts.uid)


def trusted_pod(obj: dict[str, Any], book: AddressBook, local: LocalAddress | None = None) -> Pod:
    """A Pod dict from the apiserver, its addresses chosen by :func:`member_ips`.

    Raises PolicyError (only) for an invalid object, like :func:`policy.parse_pod`.
    """
    pod = parse_pod(obj)
    return dataclasses.replace(pod, ips=member_ips(pod, pod_facts(obj), book, local))


def local_address(address: str, uid: str | None = None) -> LocalAddress:
    """A :class:`LocalAddress` from the endpoint table's text (``10.0.0.5`` or ``/32``)."""
    return LocalAddress(ipaddress.ip_address(address.split("/", maxsplit=1)[0]), uid or "")


def book_from(entries: Mapping[str, Owner]) -> AddressBook:
    """An :class:`AddressBook` from ``{"10.0.0.5": Owner(...)}`` (tests, tabbyctl)."""
    return AddressBook((ipaddress.ip_address(ip), owner) for ip, owner in entries.items())
