# The Tabby image: tabby-node (the default entrypoint), tabbyctl (used by the
# DaemonSet's install-cni init container), the IPAM garbage collector, and the
# static node-side CNI executables install-cni copies to /opt/cni/bin.
#
#   docker build -t tabby:0.1.0 .
#
# The tag must match the manifests (image: tabby:0.1.0), or set it with
# `kustomize edit set image tabby=<registry>/tabby:<tag>`.
#
# lab/images.py builds the equivalent image with no Docker daemon for the lab's
# nodes: the same Debian packages and Python dependencies, but Debian bookworm's
# own python3 (3.11, from mmdebstrap) with a venv at /opt/tabby instead of this
# python.org build in /usr/local. Either way the interpreter and the console
# scripts share one bin/ directory, which bgp.speaker relies on (it runs the
# `exabgp` found beside sys.executable). The lab writes Tabby's own layer itself
# (files, bytecode, dist-info, scripts) rather than running `pip install .`, so a
# code change rebuilds in seconds. Keep the two in step.

# python-iptables is an sdist with a C extension: its wheel (and the others) are
# built here, with a compiler the final image does not carry.
FROM python:3.11-slim AS wheels
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml /src/
RUN python -c 'import tomllib; print("\n".join(tomllib.load(open("/src/pyproject.toml", "rb"))["project"]["dependencies"]))' > /src/requirements.txt \
    && pip wheel --no-cache-dir --wheel-dir /wheels -r /src/requirements.txt

# The node-side CNI executables, static (a node needs no interpreter and no CNI
# plugins of its own): tabby, the forwarder to the agent (cni/forwarder), and the
# reference portmap and bandwidth plugins the conflist chains, from the Go module
# proxy. hack/build-cni.sh is the one recipe, here and for the lab's image.
FROM golang:1.26-bookworm AS cni
COPY cni/forwarder /src/cni/forwarder
COPY hack/build-cni.sh /src/hack/
RUN TABBY_CACHE_DIR=/build /src/hack/build-cni.sh \
    && mkdir /out && cp "$(dirname "$(TABBY_CACHE_DIR=/build /src/hack/build-cni.sh --print)")"/* /out/

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
COPY kernel/ kernel/
COPY ipam/ ipam/
COPY policy/ policy/
COPY cni/ cni/
COPY datastore/ datastore/
COPY tabbyctl/ tabbyctl/
COPY lab/ lab/
# kubernetes/aio is a second (asyncio) copy of the whole client, which Tabby does
# not use: left out, as in lab/images.py (PRUNED).
# (The wheels are bind-mounted, BuildKit's RUN --mount: they stay out of the layers.)
RUN --mount=type=bind,from=wheels,source=/wheels,target=/wheels \
    pip install --no-cache-dir --find-links /wheels . \
    && rm -rf /src /usr/local/lib/python3.11/site-packages/kubernetes/aio

# install-cni (tabbyctl cni install --from) copies these to the node's /opt/cni/bin.
COPY --from=cni /out/ /usr/lib/tabby/cni/

WORKDIR /
ENTRYPOINT ["tabby-node"]
