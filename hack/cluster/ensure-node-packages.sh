#!/usr/bin/env bash
# Install the Debian packages the real node (e2e/cluster/node.py) runs on, when missing:
# containerd and runc (crun cannot run containers on this machine's hybrid cgroups), the CNI
# plugins (bridge, host-local, loopback), iptables and conntrack for kube-proxy, iproute2, and
# nftables: iptables-nft leaves the tables it made behind, and only nft deletes them.
set -euo pipefail
SCRIPT_NAME=ensure-node-packages
. "$(dirname "$0")/../lib.sh"
need_debs containerd runc containernetworking-plugins iptables nftables conntrack iproute2 mount
for cmd in containerd ctr runc iptables-save ip6tables-save nft conntrack ip; do
  command -v "$cmd" >/dev/null 2>&1 || die "$cmd is not on PATH after installing the packages"
done
[ -x /usr/lib/cni/bridge ] && [ -x /usr/lib/cni/host-local ] && [ -x /usr/lib/cni/loopback ] \
  || die "the CNI plugins are not in /usr/lib/cni (package containernetworking-plugins)"
