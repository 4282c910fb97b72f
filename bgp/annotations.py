"""Kubernetes Node annotations that carry a node's BGP and tunnel facts.

Tabby keeps per-node BGP facts on the Node object (like Calico's KDD mode keeps
them in `projectcalico.org/*` annotations) so that the agent needs no extra
resource kind per node. The node agent writes them at start; every other node's
BGP config and routes are computed from them.

- `tabby.dev/ipv4-address` (`10.0.0.1/24`): the node's underlay address with its
  prefix length. It is the BGP session address and router id, the next hop others
  route to, and its subnet decides CrossSubnet encapsulation.
- `tabby.dev/as-number` (`64513`, optional): the node's own AS; the cluster default
  (BGPConfiguration `asNumber`) otherwise.
- `tabby.dev/route-reflector-cluster-id` (`244.0.0.1`): marks the node as a route
  reflector of that cluster (a dotted quad, like Calico's `routeReflectorClusterID`).
- `tabby.dev/ipv4-ipip-tunnel-addr` (`10.244.1.1`): the node's `tunl0` address
  (informational for routing: IPIP routes go via the node address, onlink).
- `tabby.dev/ipv4-vxlan-tunnel-addr` (`10.244.1.0`): the node's VXLAN device
  address, the next hop of VXLAN routes towards that node.
- `tabby.dev/vxlan-tunnel-mac` (`66:1b:...`): the MAC of the node's VXLAN device,
  for the neighbour entry of its tunnel address and the FDB entry to its address.
"""

from __future__ import annotations

IPV4_ADDRESS = "tabby.dev/ipv4-address"
AS_NUMBER = "tabby.dev/as-number"
RR_CLUSTER_ID = "tabby.dev/route-reflector-cluster-id"
IPIP_TUNNEL_ADDR = "tabby.dev/ipv4-ipip-tunnel-addr"
VXLAN_TUNNEL_ADDR = "tabby.dev/ipv4-vxlan-tunnel-addr"
VXLAN_TUNNEL_MAC = "tabby.dev/vxlan-tunnel-mac"

ALL = (
    IPV4_ADDRESS,
    AS_NUMBER,
    RR_CLUSTER_ID,
    IPIP_TUNNEL_ADDR,
    VXLAN_TUNNEL_ADDR,
    VXLAN_TUNNEL_MAC,
)
