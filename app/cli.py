"""``upr``: the command-line entry point.

Subcommands here: ``server`` and ``openapi``.  Other packages add theirs through a
``register(subparsers)`` function in ``clients/cli.py`` and ``spark_connector/cli.py``
(imported lazily, skipped when the module does not exist, so the server has no hard
dependency on them).  Each subparser sets ``func=<callable(args) -> int>``.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

#: Modules that may contribute subcommands, each with ``register(subparsers)``.
PLUGIN_MODULES = ("clients.cli", "spark_connector.cli")


def _server_parser(sub: Any) -> None:
    from app.settings import Settings

    fields = Settings.model_fields
    p = sub.add_parser(
        "server",
        help="run the HTTP/WebSocket server",
        description=(
            "Run the upr server.  Each setting comes from (highest first) this flag, the UPR_<NAME> "
            "environment variable, the --config TOML file, or the default shown."
        ),
        argument_default=argparse.SUPPRESS,
    )

    def opt(name: str, metavar: str | None = None, **kw: Any) -> None:
        info = fields[name]
        flag = "--" + name.replace("_", "-")
        help_text = f"{info.description} (default: {info.default})"
        p.add_argument(flag, dest=name, metavar=metavar, help=help_text, **kw)

    p.add_argument("--config", dest="config_file", metavar="FILE.toml", type=Path,
                   help="TOML config with any of the settings below (top level or a [server] table)")
    opt("data_dir", "DIR", type=Path)
    opt("host", "ADDR")
    opt("port", "PORT", type=int)
    opt("partitions", "N", type=int)
    opt("flush_interval_ms", "MS", type=float)
    opt("queue_memory_limit_mb", "MIB", type=int)
    opt("max_key_bytes", "BYTES", type=int)
    opt("max_value_bytes", "BYTES", type=int)
    opt("max_bulk_bytes", "BYTES", type=int)
    opt("max_bulk_items", "N", type=int)
    opt("tokens_file", "FILE", type=Path)
    opt("read_threads", "N", type=int)
    opt("stream_max_connections", "N", type=int)
    opt("stream_max_connections_per_client", "N", type=int)
    opt("stream_hello_timeout_s", "SECONDS", type=float)
    opt("stream_max_message_bytes", "BYTES", type=int)
    opt("stream_default_window_bytes", "BYTES", type=int)
    opt("stream_max_window_bytes", "BYTES", type=int)
    opt("stream_drop_after_s", "SECONDS", type=float)
    opt("ws_ping_interval_s", "SECONDS", type=float)
    opt("ws_ping_timeout_s", "SECONDS", type=float)
    opt("log_level", "LEVEL")
    p.add_argument("--access-log", dest="access_log", action="store_true", default=argparse.SUPPRESS,
                   help="log every request (costs throughput) (default: off)")
    opt("ready_file", "FILE", type=Path)
    p.set_defaults(func=_cmd_server)


def _cmd_server(args: argparse.Namespace) -> int:
    from app.auth import TokenConfigError
    from app.server import EXIT_CONFIG, serve
    from app.settings import ConfigFileError, Settings

    overrides = {k: v for k, v in vars(args).items() if k in Settings.model_fields}
    try:
        settings = Settings(**overrides)
        return serve(settings)
    except (ConfigFileError, TokenConfigError) as exc:
        print(f"upr: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        print(f"upr: invalid settings: {problems}", file=sys.stderr)
        return EXIT_CONFIG


def _openapi_parser(sub: Any) -> None:
    p = sub.add_parser("openapi", help="print the OpenAPI document (JSON)",
                       description="Print the OpenAPI document; `upr openapi > openapi/openapi.json`.")
    p.add_argument("-o", "--output", type=Path, help="write to this file instead of stdout")
    p.set_defaults(func=_cmd_openapi)


def openapi_text() -> str:
    """The OpenAPI document exactly as committed in ``openapi/openapi.json``."""
    from app.auth import TokenTable
    from app.main import create_app
    from app.settings import Settings

    app = create_app(Settings.model_construct(), tokens=TokenTable())
    return json.dumps(app.openapi(), indent=2, ensure_ascii=False) + "\n"


def _cmd_openapi(args: argparse.Namespace) -> int:
    text = openapi_text()
    if args.output:
        args.output.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="upr", description="upr: change-data-capture streaming service")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _server_parser(sub)
    _openapi_parser(sub)
    for name in PLUGIN_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and name.startswith(exc.name):
                continue  # the package or its cli module does not exist (yet)
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
