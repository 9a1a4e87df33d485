"""The WebSocket stream server (``GET /stream``): a thin asyncio adapter over the sans-I/O
stream protocol (``engine.protocol``) and the engine's snapshots.

    endpoint.py    auth and a connection slot before the upgrade, then the StreamServer
    server.py      what the connections share while the engine is open (owned by the lifespan)
    slots.py       connection limits per server and per client
    connection.py  reader + sender tasks carrying out engine.protocol.session.ServerSession
    passes.py      the sender's pass: produce visits (reader jobs or inline), send within the window
    outbox.py      everything a connection sends: control replies, markers and batches, bundles
    cursor.py      per-partition snapshot reading and encoding (executor threads), cursor dropping
    tailcache.py   encoded memory snapshots shared by connections tailing the same partitions
    hub.py         engine change notifications -> the event loop, coalesced
"""
from app.stream.endpoint import router

__all__ = ["router"]
