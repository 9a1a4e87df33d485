"""``bench.replica_undo`` runs at a tiny size and takes the undo path it measures."""
from __future__ import annotations


def test_the_replica_undo_bench_runs_at_a_tiny_size(capsys) -> None:  # type: ignore[no-untyped-def]
    from bench import replica_undo

    assert replica_undo.main(["--items", "300", "--above", "3", "30"]) == 0
    rows = capsys.readouterr().out.splitlines()[2:]
    assert [row.split()[0] for row in rows] == ["3", "30"]
