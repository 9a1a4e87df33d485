"""engine's pure modules import only the standard library (and each other).

import-linter checks the forbidden edges between packages; this test checks the stronger
rule for the pure modules that clients share with the server."""
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PURE = ["types", "errors", "config", "keys", "rollback", "failover", "protocol"]
PURE_MODULES = {f"engine.{name}" for name in PURE}


def _pure_files() -> list[Path]:
    files: list[Path] = []
    for name in PURE:
        path = ROOT / "engine" / name
        if path.is_dir():
            files.extend(sorted(path.rglob("*.py")))
        elif path.with_suffix(".py").exists():
            files.append(path.with_suffix(".py"))
    return files


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


def _allowed(module: str) -> bool:
    top = module.split(".")[0]
    if top in sys.stdlib_module_names or top == "__future__":
        return True
    return any(module == m or module.startswith(m + ".") for m in PURE_MODULES)


def test_pure_engine_modules_import_only_stdlib_and_each_other() -> None:
    files = _pure_files()
    assert len(files) >= 5
    offenders = {
        str(path.relative_to(ROOT)): sorted(m for m in _imports(path) if not _allowed(m)) for path in files
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_engine_package_init_imports_nothing() -> None:
    assert _imports(ROOT / "engine" / "__init__.py") == set()
