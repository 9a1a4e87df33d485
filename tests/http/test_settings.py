"""``app.settings``: precedence (flag, environment, TOML file, default) and config-file errors."""
from __future__ import annotations

from pathlib import Path

import pytest

from app.settings import ConfigFileError, Settings


def test_settings_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "upr.toml"
    cfg.write_text('[server]\nport = 9001\npartitions = 16\nflush_interval_ms = 7\n')
    monkeypatch.setenv("UPR_PARTITIONS", "32")
    s = Settings(config_file=cfg, flush_interval_ms=9)
    assert (s.port, s.partitions, s.flush_interval_ms) == (9001, 32, 9)  # toml < env < flag
    assert s.host == "127.0.0.1" and s.data_dir == Path("./data")
    assert s.engine_config().partitions == 32


def test_settings_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(__import__("os").environ):
        if name.startswith("UPR_"):
            monkeypatch.delenv(name)
    s = Settings()
    assert (s.data_dir, s.host, s.port, s.partitions, s.flush_interval_ms) == (Path("./data"), "127.0.0.1", 8000, 64, 5)


@pytest.mark.parametrize("text", ["port = 1\nprot = 2\n", "port = [", "[server]\nflush = 1\n"])
def test_config_file_errors(tmp_path: Path, text: str) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text(text)
    with pytest.raises(ConfigFileError):
        Settings(config_file=cfg)


def test_config_file_missing(tmp_path: Path) -> None:
    with pytest.raises(ConfigFileError):
        Settings(config_file=tmp_path / "nope.toml")
