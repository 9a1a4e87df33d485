"""The partition map's invariants and its JSON form (what etcd stores and GET /cluster answers)."""
import pytest

from engine.cluster.partition_map import MapFormatError, PartitionMap, Placement, copies_per_node

MAP = PartitionMap(7, (Placement("a", ("b",)), Placement("b", ("c",)), Placement(None, ("a",))))


def test_json_round_trip_keeps_revision_and_every_placement() -> None:
    assert PartitionMap.from_json(MAP.to_json()) == MAP


def test_json_names_every_partition_in_order() -> None:
    assert MAP.to_json()["partitions"][2] == {"partition": 2, "active": None, "replicas": ["a"]}


def test_queries_by_node() -> None:
    assert MAP.active_partitions("b") == (1,)
    assert MAP.replica_partitions("a") == (2,)
    assert MAP.nodes() == {"a", "b", "c"}
    assert copies_per_node(MAP.placements) == {"a": (1, 1), "b": (1, 1), "c": (0, 1)}


def test_a_successor_has_the_next_revision_and_the_same_partition_count() -> None:
    nxt = MAP.succeeded_by([Placement("c")] * 3)
    assert nxt.revision == 8
    assert MAP.changed_partitions(nxt) == (0, 1, 2)
    with pytest.raises(MapFormatError):
        MAP.succeeded_by([Placement("c")])


def test_one_node_never_holds_two_copies_of_a_partition() -> None:
    with pytest.raises(MapFormatError, match="two copies"):
        Placement("a", ("a",))


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"revision": -1, "partitions": []}, "revision"),
        ({"revision": True, "partitions": []}, "revision"),
        ({"revision": 1}, "partitions"),
        ({"revision": 1, "partitions": [{"partition": 1, "active": "a", "replicas": []}]}, r"partitions\[0\].partition"),
        ({"revision": 1, "partitions": [{"partition": 0, "active": "", "replicas": []}]}, r"partitions\[0\].active"),
        ({"revision": 1, "partitions": [{"partition": 0, "active": "a", "replicas": [3]}]}, r"partitions\[0\].replicas"),
        ({"revision": 1, "partitions": [{"partition": 0, "active": "a", "replicas": ["a"]}]}, "two copies"),
        ([], "revision"),
    ],
)
def test_a_malformed_map_is_refused_naming_the_field(data: object, field: str) -> None:
    with pytest.raises(MapFormatError, match=field):
        PartitionMap.from_json(data)  # type: ignore[arg-type]
