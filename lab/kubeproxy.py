"""kube-proxy for a lab node: its configuration and argv, in one place.

The real-node lab (``lab.kubenode``) starts it beside kubelet; the soak starts it
alone in the truth table's node namespaces, so that Service IPs are translated by the
real kube-proxy there too. Either way it touches no machine-wide conntrack sysctl and
serves its health and metrics on the node's own loopback.
"""

from __future__ import annotations

from pathlib import Path

import yaml

MODES = ("iptables", "nftables")


def kube_proxy_config(
    *, node_name: str, kubeconfig: Path, mode: str, cluster_cidr: str
) -> dict[str, object]:
    """The KubeProxyConfiguration of one node (pure)."""
    if mode not in MODES:
        raise ValueError(f"kube-proxy mode {mode!r} is not one of {', '.join(MODES)}")
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": node_name,
        "mode": mode,
        "clusterCIDR": cluster_cidr,
        "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        # Touch no machine-wide conntrack sysctl.
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
        "iptables": {"minSyncPeriod": "1s"},
        "nftables": {"minSyncPeriod": "1s"},
    }


def kube_proxy_argv(binary: Path, config_path: Path, config: dict[str, object]) -> list[str]:
    """Write *config* to *config_path*; the command line that runs kube-proxy with it."""
    config_path.write_text(yaml.safe_dump(config))
    return [str(binary), f"--config={config_path}", "--v=1"]
