"""BGP routing between nodes: ExaBGP configuration, the API bridge, learned routes.

Compute (pure, tested with plain data):
- `annotations`: the Node annotations carrying BGP/tunnel facts;
- `nodes`: those facts parsed from raw Node dicts;
- `config`: who peers with whom (mesh, reflectors, BGPPeers) → ExaBGP config text;
- `messages`: ExaBGP's JSON API lines → typed events;
- `rib`: learned routes per peer, loop filters, replay on `up`, route reflection;
- `routes`: announcements, and kernel routes/neighbours/FDB from learned routes.

Apply (seams, tested against the real thing in tests/integration/bgp):
- `speaker`: the supervised ExaBGP process and the bridge to its API process
  (`api_helper.py`, a stdlib-only helper ExaBGP forks, which hands its pipes
  to the agent), plus the status file;
- `kernel`: routes of protocol 81 (and VXLAN neighbour/FDB entries) via pyroute2.

`controller.BGPController` wires both halves for the node agent.
"""
