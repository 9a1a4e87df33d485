"""What can go wrong joining or running a cluster, each a one-line message for the operator.

    ClusterError
    ├── ClusterMismatch     --partitions/--replicas differ from the cluster's fixed settings
    ├── DuplicateNode       another live node already uses this --node name
    └── LeaseLost           this node's lease expired: it must stop serving (fencing)
"""
from __future__ import annotations


class ClusterError(Exception):
    """Base of the cluster's own errors."""


class ClusterMismatch(ClusterError):
    pass


class DuplicateNode(ClusterError):
    pass


class LeaseLost(ClusterError):
    pass
