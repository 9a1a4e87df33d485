"""engine's pure modules import only the standard library (and each other).

import-linter checks the forbidden edges between packages; this test checks the stronger
rule for the pure modules that clients share with the server."""
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: The pure layer is whole folders: a module added there is checked without editing this list.
PURE_PACKAGES = ["core", "protocol", "cluster"]
PURE_MODULES = {f"engine.{name}" for name in PURE_PACKAGES}


def _pure_files() -> list[Path]:
    return [path for name in PURE_PACKAGES for path in sorted((ROOT / "engine" / name).rglob("*.py"))]


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
