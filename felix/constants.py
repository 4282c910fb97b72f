"""Numbers and names the node agent writes into the kernel, in one place.

Everything Tabby programs must be recognisable as its own so that resync never
touches what others wrote (DESIGN.md, rules of the house).
"""

from typing import Final

# Route protocol (rtm_protocol) of the /32 routes to local pods on cali veths.
TABBY_POD_ROUTE_PROTO: Final = 80

# Host-side veth names: prefix + 11 hex chars of sha1("<namespace>.<pod>").
HOST_IFACE_PREFIX: Final = "cali"

# Host-side veth MAC: the same everywhere, so pods never learn a real host MAC.
HOST_VETH_MAC: Final = "ee:ee:ee:ee:ee:ee"

# Link-local gateway the pod routes through; the host answers ARP (proxy_arp).
POD_GATEWAY: Final = "169.254.1.1"
