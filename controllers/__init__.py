"""Cluster-wide controllers (the tabby-controllers Deployment): IPAM garbage collection."""
