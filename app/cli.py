"""``upr``: the one command tree of the product.

Subcommands here: ``server`` (its flags derived from ``app.settings.Settings``, see
``app.settings_flags``) and ``openapi``.  Every other group joins the same tree through a
``register(subparsers)`` function listed in ``PLUGIN_MODULES``: the client commands and
``backup`` (``clients/cli.py``), ``cluster`` (``clients/cluster_cli.py``) and ``index``
(``spark_connector/cli.py``).  Each subparser sets ``func=<callable(args) -> int>``.

Registering a group imports only its argument parsing; heavy dependencies load when a command
runs.  Those that come from an optional extra (``pip install 'upr[spark]'``) are named in
``EXTRA_OF_MODULE``: when one is missing the command says which extra to install, in one line.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Sequence

TYPE_CHECKING = False   # typing only for the checkers: `upr index query` imports this module (docs/benchmarks.md)
if TYPE_CHECKING:
    from typing import Any

#: Modules that contribute subcommands, each with ``register(subparsers)``.
PLUGIN_MODULES = ("clients.cli", "clients.cluster_cli", "spark_connector.cli")

#: Groups whose module is known before parsing: ``upr index ...`` builds only that group's
#: parser, so a JVM-free ``upr index query`` does not import the server's settings nor the
#: client stack of the other groups (most of its start-up, docs/benchmarks.md, index lookups).
MODULE_OF_GROUP = {"index": "spark_connector.cli"}

#: Top-level modules that come from an optional extra of the ``upr`` distribution, not its core.
EXTRA_OF_MODULE = {"pyspark": "spark", "py4j": "spark", "pandas": "spark", "pyarrow": "spark"}

EXIT_MISSING_EXTRA = 1


def _server_parser(sub: Any) -> None:
    from app.settings import Settings
    from app.settings_flags import add_settings_flags

    p = sub.add_parser(
        "server",
        help="run the HTTP/WebSocket server",
        description=(
            "Run the upr server.  Each setting comes from (highest first) this flag, the UPR_<NAME> "
            "environment variable, the --config TOML file (top level or a [server] table), or the "
            "default shown."
        ),
        argument_default=argparse.SUPPRESS,
    )
    add_settings_flags(p, Settings)
    p.set_defaults(func=_cmd_server)


def _cmd_server(args: argparse.Namespace) -> int:
    from app.auth import TokenConfigError
    from app.server import EXIT_CONFIG, serve
    from app.settings import ConfigFileError, Settings
    from pydantic import ValidationError

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
    from pathlib import Path        # here: `upr index query` never builds this parser

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


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The whole command tree, or only the group ``argv`` names when ``MODULE_OF_GROUP`` knows
    its module (the same parser for that group, without importing the others)."""
    parser = argparse.ArgumentParser(prog="upr", description="upr: change-data-capture streaming service")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    group = argv[0] if argv else None
    if group in MODULE_OF_GROUP:
        importlib.import_module(MODULE_OF_GROUP[group]).register(sub)
        return parser
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


def _top_module(exc: ModuleNotFoundError) -> str:
    return (exc.name or "").partition(".")[0]


def missing_extra(exc: ModuleNotFoundError) -> str | None:
    """The extra to install when ``exc`` is a module of an optional extra, else ``None``."""
    return EXTRA_OF_MODULE.get(_top_module(exc))


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(argv).parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ModuleNotFoundError as exc:
        extra = missing_extra(exc)
        if extra is None:
            raise
        print(f"upr {args.command}: needs the {extra!r} extra, which is not installed "
              f"(no module {_top_module(exc)!r}); "
              f"install it with: pip install 'upr[{extra}]'", file=sys.stderr)
        return EXIT_MISSING_EXTRA


if __name__ == "__main__":
    sys.exit(main())
