"""NetworkPolicy, Pod and Namespace as frozen, validated values.

The parsers take the JSON dicts the apiserver returns and apply the API's own
defaults, so the compiler never has to think about them again:

* ``policyTypes`` absent or empty: Ingress always, Egress only when the
  ``egress`` list is non-empty (``egress: []`` does not add Egress).
* a direction in ``policyTypes`` whose rule list is absent or ``[]`` has no
  rules: it isolates and allows nothing.  Rules of a direction not in
  ``policyTypes`` are ignored.
* ``from``/``to`` absent or ``[]``: any peer.  ``ports`` absent or ``[]``:
  any port and protocol.  Port ``protocol`` defaults to TCP.
* a peer with a ``podSelector`` and no ``namespaceSelector`` means the
  policy's own namespace; with both, the two are ANDed; ``{}`` selects all.
* ipBlock CIDRs are masked (``10.0.0.5/8`` means ``10.0.0.0/8``) because the
  API accepted non-canonical CIDRs and old e2e binaries send them.

Everything invalid raises :class:`PolicyError`, never another exception.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from policy.errors import PolicyError
from policy.selectors import EVERYTHING, LabelSelector, parse_selector

PROTOCOLS = ("TCP", "UDP", "SCTP")
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"

_SVC_NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
_DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


@dataclass(frozen=True)
class PortSpec:
    """One ``ports[]`` entry: a protocol and optionally a port or range.

    ``port`` is an int, a port name (resolved on the destination pod), or
    None for every port of ``protocol``.  ``end_port`` makes the numeric
    ``port`` the start of an inclusive range.
    """

    protocol: str = "TCP"
    port: int | str | None = None
    end_port: int | None = None

    @property
    def is_named(self) -> bool:
        """Named ports need per-pod resolution (ipsets), numbers do not."""
        return isinstance(self.port, str)


@dataclass(frozen=True)
class PodSelection:
    """A set of pods: those in ``namespace`` (or in namespaces matching
    ``namespace_selector``) whose labels match ``pod_selector``.

    Exactly one of ``namespace`` and ``namespace_selector`` is set, except for
    :data:`ALL_PODS` style selections (no namespace, selector ``{}``).
    """

    namespace: str | None
    namespace_selector: LabelSelector | None
    pod_selector: LabelSelector = EVERYTHING

    def matches(self, pod: Pod, namespace_labels: Mapping[str, str]) -> bool:
        """Whether ``pod`` (whose namespace carries ``namespace_labels``) is in the set."""
        if self.namespace is not None:
            if pod.namespace != self.namespace:
                return False
        elif self.namespace_selector is not None and not self.namespace_selector.matches(
            namespace_labels
        ):
            return False
        return self.pod_selector.matches(pod.labels)

    def canonical(self) -> str:
        """Stable text that ipset names are hashed from."""
        if self.namespace is not None:
            ns = f"ns == {self.namespace!r}"
        elif self.namespace_selector is not None:
            ns = f"ns({self.namespace_selector.canonical()})"
        else:
            ns = "ns(all())"
        return f"{ns} / pods({self.pod_selector.canonical()})"


ALL_PODS = PodSelection(namespace=None, namespace_selector=EVERYTHING)


@dataclass(frozen=True)
class IPBlock:
    """A CIDR minus some excepted CIDRs (each strictly inside it)."""

    cidr: IPNetwork
    excepts: tuple[IPNetwork, ...] = ()

    def contains(self, ip: IPAddress) -> bool:
        """Whether ``ip`` is in the CIDR and in none of the excepts."""
        if ip.version != self.cidr.version or ip not in self.cidr:
            return False
        return not any(ip in e for e in self.excepts)

    def canonical(self) -> str:
        """Stable text that the except-set name is hashed from."""
        return f"{self.cidr} except {','.join(str(e) for e in self.excepts)}"


Peer = PodSelection | IPBlock


@dataclass(frozen=True)
class PolicyRule:
    """One ingress/egress rule: any peer in ``peers`` AND any port in ``ports``.

    An empty ``peers`` means every source/destination, including addresses
    outside the cluster; an empty ``ports`` means every port and protocol.
    """

    ports: tuple[PortSpec, ...] = ()
    peers: tuple[Peer, ...] = ()


@dataclass(frozen=True)
class NetworkPolicy:
    """A validated policy.  ``ingress``/``egress`` is None when that direction
    is not in ``policyTypes`` (the policy does not isolate it), and ``()``
    when it is but no rule allows anything."""

    namespace: str
    name: str
    pod_selector: LabelSelector = EVERYTHING
    ingress: tuple[PolicyRule, ...] | None = ()
    egress: tuple[PolicyRule, ...] | None = None

    @property
    def key(self) -> str:
        """``namespace/name``: the policy's identity (chain names hash it)."""
        return f"{self.namespace}/{self.name}"

    @property
    def target(self) -> PodSelection:
        """The pods this policy applies to."""
        return PodSelection(self.namespace, None, self.pod_selector)

    def selects(self, pod: Pod) -> bool:
        """Whether the policy applies to ``pod`` (same namespace, labels match)."""
        return pod.namespace == self.namespace and self.pod_selector.matches(pod.labels)


@dataclass(frozen=True)
class ContainerPort:
    """A container port; only named ones matter to policy."""

    name: str
    port: int
    protocol: str = "TCP"


@dataclass(frozen=True)
class Pod:
    """What policy needs of a pod.  Labels are stored as sorted pairs so the
    value stays hashable; use :attr:`labels` to read them."""

    namespace: str
    name: str
    label_items: tuple[tuple[str, str], ...] = ()
    ips: tuple[IPAddress, ...] = ()
    ports: tuple[ContainerPort, ...] = ()
    host_network: bool = False

    @property
    def labels(self) -> dict[str, str]:
        """The pod's labels as a dict."""
        return dict(self.label_items)

    @property
    def key(self) -> str:
        """``namespace/name``."""
        return f"{self.namespace}/{self.name}"

    def ips_of(self, family: int) -> tuple[IPAddress, ...]:
        """Pod IPs of one family; hostNetwork pods have none (their IP is the node's)."""
        if self.host_network:
            return ()
        return tuple(ip for ip in self.ips if ip.version == family)

    def named_port(self, name: str, protocol: str) -> int | None:
        """The container port called ``name`` with ``protocol``, if any."""
        for p in self.ports:
            if p.name == name and p.protocol == protocol:
                return p.port
        return None


@dataclass(frozen=True)
class Namespace:
    """A namespace's name and labels (always including the name label)."""

    name: str
    label_items: tuple[tuple[str, str], ...] = ()

    @property
    def labels(self) -> dict[str, str]:
        """Labels, with ``kubernetes.io/metadata.name`` as the apiserver sets it."""
        return {**dict(self.label_items), NAMESPACE_NAME_LABEL: self.name}


def make_pod(
    namespace: str,
    name: str,
    *,
    labels: Mapping[str, str] | None = None,
    ips: Iterable[str] = (),
    ports: Iterable[ContainerPort] = (),
    host_network: bool = False,
) -> Pod:
    """Convenience constructor from plain values (tests, tabbyctl)."""
    return Pod(
        namespace,
        name,
        tuple(sorted((labels or {}).items())),
        tuple(ipaddress.ip_address(ip) for ip in ips),
        tuple(ports),
        host_network,
    )


def make_namespace(name: str, labels: Mapping[str, str] | None = None) -> Namespace:
    """Convenience constructor from plain values."""
    return Namespace(name, tuple(sorted((labels or {}).items())))


# ---------------------------------------------------------------- parsing helpers


def _field(obj: dict[str, Any], key: str, kind: type | tuple[type, ...], path: str) -> Any:
    """``obj[key]`` if present and of ``kind``; None if absent or null."""
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise PolicyError(f"must be of type {_JSON_NAMES.get(names, names)}", path=path)
    return value


_JSON_NAMES = {"dict": "object", "list": "array", "str": "string", "int": "integer"}


def _reject_unknown(obj: dict[str, Any], allowed: set[str], path: str) -> None:
    """Unknown keys are typos (``form`` for ``from``) that would widen a rule."""
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise PolicyError(
            f"unknown field(s) {unknown}; expected some of {sorted(allowed)}", path=path
        )


def _metadata(obj: Any, kind: str, namespaced: bool) -> tuple[str, str]:
    """Validated (namespace, name) of an API object."""
    if not isinstance(obj, dict):
        raise PolicyError(f"a {kind} must be a JSON object, got {type(obj).__name__}")
    meta = _field(obj, "metadata", dict, "metadata")
    if meta is None:
        raise PolicyError("metadata is required", obj=kind)
    name = _field(meta, "name", str, "metadata.name")
    if not name or len(name) > 253 or not _DNS_SUBDOMAIN_RE.match(name):
        raise PolicyError(f"metadata.name {name!r} must be a DNS subdomain name", obj=kind)
    if not namespaced:
        return "", name
    ns = _field(meta, "namespace", str, "metadata.namespace")
    if not ns or len(ns) > 63 or not _DNS_LABEL_RE.match(ns):
        raise PolicyError(f"metadata.namespace {ns!r} must be a DNS label", obj=f"{kind} {name}")
    return ns, name


def _labels(meta: dict[str, Any], path: str) -> tuple[tuple[str, str], ...]:
    """Labels as sorted pairs; the apiserver guarantees syntax, we check types."""
    labels = _field(meta, "labels", dict, path) or {}
    for key, value in labels.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise PolicyError(f"label {key!r}: {value!r} must map a string to a string", path=path)
    return tuple(sorted(labels.items()))


# ---------------------------------------------------------------- NetworkPolicy


def parse_policy(obj: Any) -> NetworkPolicy:
    """Validate a ``networking.k8s.io/v1`` NetworkPolicy dict."""
    namespace, name = _metadata(obj, "networkpolicy", namespaced=True)
    ref = f"networkpolicy {namespace}/{name}"
    try:
        if obj.get("kind") not in (None, "NetworkPolicy"):
            raise PolicyError(f"kind {obj.get('kind')!r} is not NetworkPolicy", path="kind")
        if obj.get("apiVersion") not in (None, "networking.k8s.io/v1"):
            raise PolicyError(
                f"apiVersion {obj.get('apiVersion')!r} is not networking.k8s.io/v1",
                path="apiVersion",
            )
        return _parse_spec(obj, namespace, name)
    except PolicyError as err:
        raise PolicyError(err.detail, obj=ref, path=err.path) from None


def _parse_spec(obj: dict[str, Any], namespace: str, name: str) -> NetworkPolicy:
    """Spec fields plus the policyTypes defaulting rule."""
    spec = _field(obj, "spec", dict, "spec")
    if spec is None:
        raise PolicyError("spec is required", path="spec")
    selector = parse_selector(spec.get("podSelector"), "spec.podSelector")
    ingress = _parse_rules(spec, "ingress", "from", namespace)
    egress = _parse_rules(spec, "egress", "to", namespace)
    types = _parse_policy_types(_field(spec, "policyTypes", list, "spec.policyTypes"))
    if types is None:
        types = {"Ingress", "Egress"} if egress else {"Ingress"}
    return NetworkPolicy(
        namespace=namespace,
        name=name,
        pod_selector=selector,
        ingress=ingress if "Ingress" in types else None,
        egress=egress if "Egress" in types else None,
    )


def _parse_policy_types(types: list[Any] | None) -> set[str] | None:
    """None means "apply the default" (absent or empty list, like the API)."""
    if not types:
        return None
    for t in types:
        if t not in ("Ingress", "Egress"):
            raise PolicyError(f"{t!r} is not Ingress or Egress", path="spec.policyTypes")
    if len(set(types)) != len(types):
        raise PolicyError("duplicate entries", path="spec.policyTypes")
    return set(types)


def _parse_rules(
    spec: dict[str, Any], direction: str, peer_key: str, namespace: str
) -> tuple[PolicyRule, ...]:
    """All rules of one direction; absent and [] both give ()."""
    rules = _field(spec, direction, list, f"spec.{direction}") or []
    return tuple(
        _parse_rule(rule, peer_key, namespace, f"spec.{direction}[{i}]")
        for i, rule in enumerate(rules)
    )


def _parse_rule(obj: Any, peer_key: str, namespace: str, path: str) -> PolicyRule:
    """One rule: ports and peers (``from`` or ``to``)."""
    if not isinstance(obj, dict):
        raise PolicyError("a rule must be an object", path=path)
    _reject_unknown(obj, {"ports", peer_key}, path)
    ports = _field(obj, "ports", list, f"{path}.ports") or []
    peers = _field(obj, peer_key, list, f"{path}.{peer_key}") or []
    return PolicyRule(
        ports=tuple(_parse_port(p, f"{path}.ports[{i}]") for i, p in enumerate(ports)),
        peers=tuple(
            _parse_peer(p, namespace, f"{path}.{peer_key}[{i}]") for i, p in enumerate(peers)
        ),
    )


def _parse_peer(obj: Any, namespace: str, path: str) -> Peer:
    """A peer is an ipBlock, or pod and/or namespace selectors (ANDed)."""
    if not isinstance(obj, dict):
        raise PolicyError("a peer must be an object", path=path)
    _reject_unknown(obj, {"podSelector", "namespaceSelector", "ipBlock"}, path)
    present = {k for k, v in obj.items() if v is not None}
    if not present:
        raise PolicyError("a peer must set podSelector, namespaceSelector or ipBlock", path=path)
    if "ipBlock" in present:
        if present != {"ipBlock"}:
            raise PolicyError("ipBlock cannot be combined with selectors", path=path)
        return _parse_ip_block(obj["ipBlock"], f"{path}.ipBlock")
    pods = parse_selector(obj.get("podSelector"), f"{path}.podSelector")
    if obj.get("namespaceSelector") is None:
        return PodSelection(namespace, None, pods)
    ns_sel = parse_selector(obj["namespaceSelector"], f"{path}.namespaceSelector")
    return PodSelection(None, ns_sel, pods)


def _parse_cidr(value: Any, path: str) -> IPNetwork:
    """A CIDR string, masked to its network address as the API tolerates."""
    if not isinstance(value, str) or "/" not in value:
        raise PolicyError(f"{value!r} is not a CIDR such as 10.0.0.0/8", path=path)
    try:
        return ipaddress.ip_network(value, strict=False)
    except ValueError as err:
        raise PolicyError(f"{value!r} is not a valid CIDR ({err})", path=path) from None


def _parse_ip_block(obj: Any, path: str) -> IPBlock:
    """CIDR plus excepts; each except must be strictly inside the CIDR."""
    if not isinstance(obj, dict):
        raise PolicyError("ipBlock must be an object", path=path)
    _reject_unknown(obj, {"cidr", "except"}, path)
    cidr = _parse_cidr(obj.get("cidr"), f"{path}.cidr")
    raw_excepts = _field(obj, "except", list, f"{path}.except") or []
    excepts: list[IPNetwork] = []
    for i, raw in enumerate(raw_excepts):
        exc = _parse_cidr(raw, f"{path}.except[{i}]")
        if (
            exc.version != cidr.version
            or not exc.subnet_of(cidr)  # type: ignore[arg-type]
            or exc.prefixlen <= cidr.prefixlen
        ):
            raise PolicyError(
                f"{raw!r} must be a strict subset of cidr {cidr}", path=f"{path}.except[{i}]"
            )
        excepts.append(exc)
    return IPBlock(cidr, tuple(sorted(set(excepts), key=_net_sort_key)))


def _net_sort_key(net: IPNetwork) -> tuple[int, int, int]:
    """Sort networks of either family deterministically."""
    return (net.version, int(net.network_address), net.prefixlen)


def _parse_port(obj: Any, path: str) -> PortSpec:
    """protocol (default TCP), port (number or name), endPort (range end)."""
    if not isinstance(obj, dict):
        raise PolicyError("a port must be an object", path=path)
    _reject_unknown(obj, {"protocol", "port", "endPort"}, path)
    protocol = _protocol(obj)
    if protocol not in PROTOCOLS:
        raise PolicyError(f"protocol {protocol!r} is not one of TCP, UDP, SCTP", path=path)
    port = _parse_port_value(obj.get("port"), f"{path}.port")
    end_port = obj.get("endPort")
    if end_port is not None:
        if not isinstance(port, int):
            raise PolicyError("endPort needs a numeric port", path=f"{path}.endPort")
        if not _is_port_number(end_port) or end_port < port:
            raise PolicyError(
                f"endPort {end_port!r} must be a number from port ({port}) to 65535",
                path=f"{path}.endPort",
            )
    return PortSpec(protocol, port, end_port)


def _protocol(obj: dict[str, Any]) -> Any:
    """``protocol``, defaulted to TCP when absent or null (the API default)."""
    value = obj.get("protocol")
    return "TCP" if value is None else value


def _is_port_number(value: Any) -> bool:
    """An int (not a bool) in 1..65535."""
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 65535


def _parse_port_value(value: Any, path: str) -> int | str | None:
    """A port number or an IANA service name as the API validates it."""
    if value is None:
        return None
    if isinstance(value, str):
        if len(value) > 15 or not _SVC_NAME_RE.match(value) or "--" in value:
            raise PolicyError(
                f"port name {value!r} must be 1-15 lowercase letters, digits or '-'"
                " (no leading, trailing or double '-')",
                path=path,
            )
        if not re.search("[a-z]", value):
            raise PolicyError(
                f"port name {value!r} needs a letter; write a number without quotes",
                path=path,
            )
        return value
    if not _is_port_number(value):
        raise PolicyError(f"port {value!r} must be a number in 1-65535 or a name", path=path)
    return int(value)


# ---------------------------------------------------------------- Pod, Namespace


def parse_pod(obj: Any) -> Pod:
    """A Pod dict from the apiserver; finished pods have no IPs any more."""
    namespace, name = _metadata(obj, "pod", namespaced=True)
    ref = f"pod {namespace}/{name}"
    try:
        labels = _labels(obj["metadata"], "metadata.labels")
        spec = _field(obj, "spec", dict, "spec") or {}
        status = _field(obj, "status", dict, "status") or {}
        host_network = bool(_field(spec, "hostNetwork", bool, "spec.hostNetwork"))
        ips = _pod_ips(status)
        ports = _container_ports(spec)
    except PolicyError as err:
        raise PolicyError(err.detail, obj=ref, path=err.path) from None
    return Pod(namespace, name, labels, ips, ports, host_network)


def _pod_ips(status: dict[str, Any]) -> tuple[IPAddress, ...]:
    """``status.podIPs`` (or the older ``podIP``), none once the pod finished."""
    if status.get("phase") in ("Succeeded", "Failed"):
        return ()
    entries = _field(status, "podIPs", list, "status.podIPs")
    raw: list[Any]
    if entries:
        raw = [e.get("ip") if isinstance(e, dict) else e for e in entries]
    else:
        single = _field(status, "podIP", str, "status.podIP")
        raw = [single] if single else []
    ips = []
    for value in raw:
        try:
            if not isinstance(value, str):
                raise ValueError(value)
            ips.append(ipaddress.ip_address(value))
        except ValueError:
            raise PolicyError(f"{value!r} is not an IP address", path="status.podIPs") from None
    return tuple(dict.fromkeys(ips))


def _container_ports(spec: dict[str, Any]) -> tuple[ContainerPort, ...]:
    """Named container ports of all containers (unnamed ones are irrelevant)."""
    out = []
    containers = _field(spec, "containers", list, "spec.containers") or []
    for ci, container in enumerate(containers):
        cpath = f"spec.containers[{ci}]"
        if not isinstance(container, dict):
            raise PolicyError("must be an object", path=cpath)
        for pi, port in enumerate(_field(container, "ports", list, f"{cpath}.ports") or []):
            ppath = f"{cpath}.ports[{pi}]"
            if not isinstance(port, dict):
                raise PolicyError("must be an object", path=ppath)
            name = _field(port, "name", str, f"{ppath}.name")
            number: Any = port.get("containerPort")
            protocol = _protocol(port)
            if not _is_port_number(number):
                raise PolicyError(f"containerPort {number!r} is not in 1-65535", path=ppath)
            if protocol not in PROTOCOLS:
                raise PolicyError(f"protocol {protocol!r} is not TCP, UDP or SCTP", path=ppath)
            if name:
                out.append(ContainerPort(name, int(number), protocol))
    return tuple(out)


def parse_namespace(obj: Any) -> Namespace:
    """A Namespace dict; only its name and labels matter to policy."""
    _, name = _metadata(obj, "namespace", namespaced=False)
    try:
        labels = _labels(obj["metadata"], "metadata.labels")
    except PolicyError as err:
        raise PolicyError(err.detail, obj=f"namespace {name}", path=err.path) from None
    return Namespace(name, labels)
