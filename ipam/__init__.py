"""Tabby IPAM: pools, blocks, affinities and handles, Calico-style.

- `selector`: Calico selector expressions (pool and BGP peer node selectors).
- `block`: pure allocation logic of one IPAMBlock (FIFO, attributes, sequence numbers).
- `pools`: pure pool validation, selection, block enumeration and object names.
- `allocator`: `IPAMAllocator(datastore, node)`: auto_assign, assign_ip, release, tunnels.
- `gc`: empty-block, deleted-node and leak collection (pure plan + I/O).
- `report`: usage, borrowed addresses, consistency check and report files.
"""
