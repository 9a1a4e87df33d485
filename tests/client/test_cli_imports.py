"""The client command modules form no import circle: ``clients.cli`` registers the backup
commands, so ``clients.backup.cli`` may depend on shared helpers but never on ``clients.cli``."""
from __future__ import annotations

import grimp


def test_backup_cli_does_not_import_the_top_level_client_cli():
    graph = grimp.build_graph("clients")
    assert graph.find_shortest_chain(importer="clients.backup.cli", imported="clients.cli") is None
    assert graph.find_shortest_chain(importer="clients.cli", imported="clients.backup.cli") is not None


def test_the_clients_package_has_no_import_cycle():
    graph = grimp.build_graph("clients")
    cycles = [(a, b) for a in graph.modules for b in graph.find_modules_directly_imported_by(a)
              if graph.find_shortest_chain(importer=b, imported=a) is not None]
    assert cycles == []
