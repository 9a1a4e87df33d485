"""The client side of the stream protocol, sans-I/O (standard library only).

    offset       StreamOffset: the one position type (uuid, seqno, snapshot start, snapshot end)
    position     PartitionPosition: how a partition's position moves as items are processed
    checkpoint   ConsumerState / PartitionCheckpoint: what a consumer saves, and its JSON form
    ring         RingModel: the rollback ring (which applied keys to correct after a rollback)
    acks         AckTracker: the one flow-control acknowledgement policy
    actions      policies, rollback plans and the actions the session returns
    session      ClientSession: handshake, message dispatch and validation, rollback decisions
    routing      Router: which node serves which partition of a cluster consumer, and when to read the map
    errors       the client error tree

The I/O adapters (``clients.consumer``, ``spark_connector.task``) only move bytes and carry out
what ``ClientSession`` returns.
"""
