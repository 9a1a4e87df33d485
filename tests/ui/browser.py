"""A real headless Chromium for the console tests: Debian's ``chromium`` driven by Playwright.

WHY Debian's browser and not Playwright's download: Playwright's own browsers come from a CDN
outside any package manager; Debian's ``chromium`` is one ``apt-get`` away, the same way the
benchmark suite installs its peers (``bench.suite.install.ensure_debian_package``, reused here),
and Playwright (from PyPI, in the ``dev`` extra) drives it through ``executable_path``.

``python -m tests.ui.browser`` installs what is missing (``make test`` runs it first); the test
fixtures call the same function, so ``pytest tests/ui`` alone also works on a fresh machine
(as root; elsewhere the tests are skipped with the reason).
"""
from __future__ import annotations

import os
import shutil
import sys

from bench.suite.install import InstallLog, Skip, ensure_debian_package

#: the browser binary itself: Debian's /usr/bin/chromium is a shell wrapper around it
_CANDIDATES = ("/usr/lib/chromium/chromium", "/usr/bin/chromium", "/usr/bin/chromium-browser")


def find_chromium() -> str | None:
    for path in _CANDIDATES:
        if os.access(path, os.X_OK):
            return path
    return shutil.which("chromium")


def ensure_chromium() -> str:
    """The path of a Chromium binary, installing Debian's ``chromium`` if none is there;
    raises ``Skip`` with the reason when that is impossible (not root, no apt-get)."""
    return ensure_debian_package(InstallLog(apt_timeout_s=600), "chromium", find_chromium)


def ensure_playwright() -> None:
    try:
        import playwright  # noqa: F401
    except ImportError:
        raise Skip("the Python package playwright is missing: pip install -e '.[dev]'") from None


def main() -> int:
    try:
        ensure_playwright()
        path = ensure_chromium()
    except Skip as exc:
        print(f"browser tests will be skipped: {exc}", file=sys.stderr)
        return 0  # the suite still runs; the skip says why
    print(f"chromium for the browser tests: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
