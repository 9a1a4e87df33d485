"""``GET /streams``: the open stream connections (filled in by the stream endpoint)."""
from __future__ import annotations

from fastapi import APIRouter

from app.cluster.replication import is_replication
from app.deps import ReadCtx
from app.models import PartitionStreamStatus, StreamInfo, StreamList
from app.routes.responses import problems

router = APIRouter(tags=["streams"])


@router.get("/streams", summary="Open stream connections", response_model=StreamList, responses=problems(401, 403))
async def list_streams(ctx: ReadCtx) -> StreamList:
    """Every open connection: name, remote address, partitions with last sent seqno and lag
    behind the high seqno, bytes buffered (unacknowledged), barriers pending."""
    return StreamList(
        streams=[
            StreamInfo(
                id=s.id, name=s.name, kind="replication" if is_replication(s.name) else "consumer", remote=s.remote, codec=s.codec, connected_at=s.connected_at,
                partitions=[
                    PartitionStreamStatus(
                        partition=p.partition, last_sent_seqno=p.last_sent_seqno, lag=p.lag,
                        purge_seqno=getattr(p, "purge_seqno", 0), purge_distance=getattr(p, "purge_distance", 0),
                    )
                    for p in s.partitions
                ],
                bytes_buffered=s.bytes_buffered, barriers_pending=s.barriers_pending,
                window_bytes=getattr(s, "window_bytes", 0), cursor_drops=getattr(s, "cursor_drops", 0),
                rollbacks=getattr(s, "rollbacks", 0),
            )
            for s in ctx.streams.statuses()
        ]
    )
