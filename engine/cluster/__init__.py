"""The cluster's decisions, as pure functions of what was observed.

Standard library only, like ``engine.core``: the server's orchestrator, every node and the
clients that follow the map all reason about the same partition map, so its type and its rules
live below every adapter.  Nothing here talks to etcd or to another node; a driver observes,
calls these functions and carries out what they return (Patroni's one-HA-cycle-per-loop shape).

    partition_map   the map: which node is active for each partition and which hold replicas
    placement       where copies should live: balanced, stable, distinct nodes per partition
    promotion       which replica takes over a partition whose active node died
    orchestration   one orchestrator step: observed nodes, map and replica progress -> actions
"""
