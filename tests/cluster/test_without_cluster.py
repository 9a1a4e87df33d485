"""Without ``--cluster`` nothing changes: no cluster state, ``GET /cluster`` says so, writes as before."""
from __future__ import annotations

from pathlib import Path

from tests.support.asgi import in_process_app


async def test_a_single_node_has_no_cluster(tmp_path: Path) -> None:
    async with in_process_app(tmp_path / "data", partitions=4) as served:
        assert served.app.state.cluster is None
        r = await served.client.get("/cluster")
        assert r.status_code == 404 and r.json()["detail"].startswith("this node is not in a cluster")
        assert (await served.client.put("/docs/k", content=b"v")).status_code in (200, 201)
        states = {p["state"] for p in (await served.client.get("/partitions")).json()["partitions"]}
        assert states == {"active"}
