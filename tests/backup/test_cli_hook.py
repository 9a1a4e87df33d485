"""`upr backup ...` is reachable from the root `upr` command, not only from its own module."""
import subprocess
import sys


def test_upr_root_command_offers_backup_actions() -> None:
    out = subprocess.run(
        [sys.executable, "-c", "import sys; from app.cli import main; sys.exit(main(['backup', '--help']))"],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    for action in ("create", "info", "verify", "restore", "merge"):
        assert action in out.stdout


def test_backup_info_on_missing_archive_is_one_line_error(tmp_path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", "import sys; from app.cli import main; sys.exit(main())",
         "backup", "info", "--archive", str(tmp_path / "nope")],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode != 0
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
