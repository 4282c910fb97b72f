#!/usr/bin/env bash
# Install the Debian packages Tabby's tests and lab use, if any are missing.
# Idempotent and quick when everything is there (no apt-get update then).
set -euo pipefail

PACKAGES=(iproute2 iptables ipset conntrack nftables socat tcpdump ethtool procps psmisc
  containerd runc containernetworking-plugins bird2 gobgpd iperf3 busybox-static skopeo umoci
  mmdebstrap docker.io
  openssl iputils-ping netcat-openbsd curl wget dash)

missing=()
for pkg in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "[install-deps] installing: ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  # Packages must not start their services (docker.io would start dockerd in the
  # host's own network namespace): lab/docker.py starts dockerd in namespaces of its
  # own. A policy-rc.d that refuses every start, only for this install.
  guard=""
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    guard=/usr/sbin/policy-rc.d
    printf '#!/bin/sh\n# tabby install-deps: no service starts during the install\nexit 101\n' >"$guard"
    chmod 755 "$guard"
    trap 'rm -f "$guard"' EXIT
  fi
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
command -v go >/dev/null || { echo "[install-deps] Go is required (1.26+) to build kube-apiserver and etcd" >&2; exit 1; }
