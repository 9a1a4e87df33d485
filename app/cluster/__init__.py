"""The server's side of the cluster: talking to etcd and carrying out the pure decisions of
``engine.cluster``.  Adapters only: every decision is made in ``engine.cluster``."""
