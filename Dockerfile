# The Tabby image: tabby-node (the default entrypoint), tabbyctl (used by the
# DaemonSet's install-cni init container) and the IPAM garbage collector.
#
#   docker build -t tabby:0.1.0 .
#
# The tag must match the manifests (image: tabby:0.1.0), or set it with
# `kustomize edit set image tabby=<registry>/tabby:<tag>`.
FROM python:3.11-slim

# What the agent drives on the node: iptables (nft and legacy front ends,
# libxtables for python-iptables), ipset, iproute2 (`ip`, also used by the
# DaemonSet's start script to find the node's prefix), conntrack (flushing
# flows of deleted pods), kmod (loading ipip/vxlan/ip_set modules from the
# host's /lib/modules).
RUN apt-get update \
    && apt-get install -y --no-install-recommends iptables ipset iproute2 conntrack kmod \
    && rm -rf /var/lib/apt/lists/*

# Copy only what the package needs (no .venv, caches or test data in the
# image); the list mirrors [tool.setuptools.packages.find] in pyproject.toml.
WORKDIR /src
COPY pyproject.toml README.md ./
COPY controllers/ controllers/
COPY felix/ felix/
COPY bgp/ bgp/
COPY ipam/ ipam/
COPY policy/ policy/
COPY cni/ cni/
COPY datastore/ datastore/
COPY tabbyctl/ tabbyctl/
COPY lab/ lab/
RUN pip install --no-cache-dir . \
    && rm -rf /src

WORKDIR /
ENTRYPOINT ["tabby-node"]
