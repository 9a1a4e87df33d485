"""``StreamOffset``, the one position type (uuid, seqno, snapshot start, snapshot end); defined in the
pure layer (``engine.protocol.client.offset``) so the client protocol session and Spark share it."""
from engine.protocol.client.offset import StreamOffset

__all__ = ["StreamOffset"]
