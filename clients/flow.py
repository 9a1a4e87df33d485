"""The client's flow-control acknowledgements; the one ack policy lives in the pure layer
(``engine.protocol.client.acks``), shared by the consumer and the Spark task."""
from engine.protocol.client.acks import AckTracker

__all__ = ["AckTracker"]
