"""Server settings: one typed class, read from (highest priority first)
command-line flags, ``UPR_*`` environment variables, an optional TOML file, defaults.

No instance exists at import time: ``upr server`` builds one from its flags, tests
build their own.  The TOML file uses the field names below, either at top level or
under a ``[server]`` table; unknown keys are an error so a typo never silently falls
back to a default.
"""
from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, CliSuppress, PydanticBaseSettingsSource, SettingsConfigDict

from engine.config import EngineConfig

if TYPE_CHECKING:
    from app.cluster.node import NodeConfig

MiB = 1024 * 1024


class ConfigFileError(ValueError):
    """The TOML config file is missing, unreadable or has unknown keys."""


class _TomlFileSource(PydanticBaseSettingsSource):
    """Reads the TOML file named by ``config_file`` (flag) or ``UPR_CONFIG_FILE`` (env).

    WHY a custom source: the file's path is itself a setting, and the file must rank
    below environment variables, which pydantic-settings' stock TOML source cannot
    do with a path chosen at run time."""

    def __init__(self, settings_cls: type[BaseSettings], path: Path | None) -> None:
        super().__init__(settings_cls)
        self._values = _read_toml(path) if path else {}
        if path:
            self._values.setdefault("config_file", path)

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self._values.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self._values)


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigFileError(f"config file {path} does not exist") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigFileError(f"config file {path} is not valid TOML: {exc}") from None
    if isinstance(data.get("server"), dict):
        data = {**{k: v for k, v in data.items() if k != "server"}, **data["server"]}
    unknown = sorted(set(data) - set(Settings.model_fields))
    if unknown:
        raise ConfigFileError(f"config file {path}: unknown setting(s) {', '.join(unknown)}")
    return data


class Settings(BaseSettings):
    """Everything ``upr server`` can be told.

    Each field is a ``--flag`` of the same name (``app.settings_flags`` derives them), an
    ``UPR_<NAME>`` variable and a TOML key; its description (``Field(description=...)`` or a
    docstring under the field) is the flag's help, so a field is declared here and nowhere else."""

    model_config = SettingsConfigDict(env_prefix="UPR_", extra="ignore", validate_default=True,
                                      use_attribute_docstrings=True)

    config_file: Path | None = Field(None, description="TOML file with any of these settings")
    data_dir: Path = Field(Path("./data"), description="directory holding the LMDB environment")
    host: str = Field("127.0.0.1", description="address to bind; non-loopback requires tokens")
    port: int = Field(8000, ge=0, le=65535, description="TCP port (0 = pick a free one)")
    partitions: int = Field(64, ge=1, le=1024, description="partition count (fixed when the data dir is created)")
    flush_interval_ms: float = Field(5.0, gt=0, le=60_000, description="how often memory-durability writes are persisted while a persist write, a persisted/majority stream or a replica waits on it; otherwise rounds may gather up to 100 ms (a replica copy's rounds start at most every 50 ms under a steady stream)")
    gil_switch_interval_ms: float = Field(
        5.0, gt=0, le=100,
        description="the server process's GIL switch interval (Python's sys.setswitchinterval): "
        "the longest the event loop waits for the writer or flusher thread to let it run; "
        "shorter switches more often, which costs fan-out more than it saves the tail")
    queue_memory_limit_mb: int = Field(
        1024, ge=1, description="write queues above this many MiB answer 429 (backpressure)"
    )
    flush_failure_backlog_bytes: int = Field(
        64 * MiB, ge=0,
        description="while flushing to disk fails (disk full), writes answer 429 once this many bytes are unpersisted",
    )
    max_key_bytes: int = Field(250, ge=1, le=250, description="largest key in UTF-8 bytes")
    max_value_bytes: int = Field(20 * MiB, ge=1, description="largest document value (PUT body) in bytes")
    max_bulk_bytes: int = Field(64 * MiB, ge=1, description="largest POST /docs/_bulk body in bytes")
    max_request_bytes: int = Field(
        8 * MiB, ge=1024, description="largest body of any other request (POST /positions/check, /admin/...) in bytes"
    )
    max_bulk_items: int = Field(10_000, ge=1, description="most operations in one POST /docs/_bulk")
    durability_timeout_ms: int = Field(
        10_000, ge=1, le=60_000,
        description="how long a majority/persist_majority write waits for its copies unless it asks otherwise "
        "(?durability_timeout_ms, at most 60000), then 504 durability-ambiguous",
    )
    tokens_file: Path | None = Field(None, description="TOML or JSON file of bearer tokens and roles")
    tokens: CliSuppress[str | None] = Field(
        None, description="bearer tokens inline, 'token=role,token=role' or JSON (usually via UPR_TOKENS)"
    )
    read_threads: int = Field(4, ge=1, le=64, description="executor threads for engine reads")
    stream_max_connections: int = Field(
        1000, ge=1, description="open GET /stream connections; more are refused with 503 before the upgrade"
    )
    stream_max_connections_per_client: int = Field(
        100, ge=1, description="open GET /stream connections per bearer token (per address when auth is off); "
        "more are refused with 429 before the upgrade"
    )
    stream_hello_timeout_s: float = Field(
        10.0, gt=0, description="close a stream connection (error hello_timeout, code 1008) that sends no hello this long"
    )
    stream_max_message_bytes: int = Field(
        1 << 20, ge=1024, description="largest WebSocket message a stream client may send (close 1009 past it)"
    )
    stream_default_window_bytes: int = Field(
        16 * MiB, ge=4096, description="flow-control window for clients whose hello asks for none"
    )
    stream_max_window_bytes: int = Field(
        64 * MiB, ge=4096, description="largest flow-control window a hello may ask for; larger is refused (invalid_field)"
    )
    stream_drop_after_s: float = Field(
        2.0, gt=0, description="release a stalled consumer's memory snapshot after this long (cursor dropping)"
    )
    ws_ping_interval_s: float = Field(20.0, gt=0, description="WebSocket keep-alive ping interval")
    ws_ping_timeout_s: float = Field(20.0, gt=0, description="close a stream whose pong is this late (dead peer)")
    log_level: str = Field("info", description="uvicorn log level")
    access_log: bool = Field(False, description="log every request (costs throughput)")
    ready_file: Path | None = Field(None, description="write the bound URL to this file once serving")
    cluster: str | None = Field(
        None, description="join a cluster coordinated by etcd: etcd://HOST:PORT[,HOST:PORT...] (off: a single node)")
    node: str | None = Field(None, description="this node's name in the cluster (unique among live nodes)")
    advertise: str | None = Field(
        None, description="the URL other nodes and clients reach this node at (default: http://HOST:PORT)")
    replicas: int = Field(1, ge=0, le=3, description="replica copies per partition (fixed when the cluster is created)")
    lease_ttl_s: int = Field(3, ge=2, le=60, description="a node whose lease is not renewed this long is failed over")
    cluster_prefix: str = Field("/upr/default", description="etcd key prefix of the cluster (several clusters per etcd)")
    cluster_initial_nodes: int = Field(
        1, ge=1, description="live nodes a new cluster waits for before placing its partitions")
    cluster_token: CliSuppress[str | None] = Field(
        None, description="the bearer token this node presents to its peers (usually via UPR_CLUSTER_TOKEN): "
        "replication streams need the admin role when tokens are configured",
    )
    replica_replace_after_s: float = Field(
        60.0, ge=0, description="a gone node keeps its replica slots this long (a restart resyncs them) before "
                                "they are placed on other nodes")
    cluster_auto_rebalance: bool = Field(
        False, description="when a node joins a cluster whose map is placed, the orchestrator rebalances on its "
                           "own (else the node holds nothing until `upr cluster add NODE` or `rebalance`)")

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        value = value.lower()
        if value not in {"critical", "error", "warning", "info", "debug", "trace"}:
            raise ValueError("must be one of critical, error, warning, info, debug, trace")
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        init_kwargs = getattr(init_settings, "init_kwargs", {})
        path = init_kwargs.get("config_file") or os.environ.get("UPR_CONFIG_FILE")
        return init_settings, env_settings, _TomlFileSource(settings_cls, Path(path) if path else None)

    def stream_limits(self) -> "StreamLimits":
        """The stream adapter's half of these settings."""
        from app.stream.connection import StreamLimits
        from engine.protocol.messages import ProtocolLimits

        protocol = ProtocolLimits(
            max_message_bytes=self.stream_max_message_bytes,
            default_window_bytes=min(self.stream_default_window_bytes, self.stream_max_window_bytes),
            max_window_bytes=self.stream_max_window_bytes,
        )
        return StreamLimits(protocol=protocol, drop_after_s=self.stream_drop_after_s,
                            max_connections=self.stream_max_connections,
                            max_connections_per_client=self.stream_max_connections_per_client,
                            hello_timeout_s=self.stream_hello_timeout_s)

    def cluster_endpoints(self) -> list[str]:
        """``--cluster``'s etcd endpoints as http URLs; ValueError with a one-line reason."""
        raw = self.cluster or ""
        if not raw.startswith("etcd://"):
            raise ValueError(f"--cluster must look like etcd://HOST:PORT[,HOST:PORT], got {raw!r}")
        hosts = [h.strip() for h in raw[len("etcd://"):].split(",") if h.strip()]
        if not hosts or any(":" not in h or "/" in h for h in hosts):
            raise ValueError(f"--cluster must look like etcd://HOST:PORT[,HOST:PORT], got {raw!r}")
        return [f"http://{h}" for h in hosts]

    def node_config(self) -> "NodeConfig":
        """The cluster node's half of these settings (``--cluster`` given); ValueError with a
        one-line reason when they do not make a node."""
        from app.cluster.node import NodeConfig

        endpoints = self.cluster_endpoints()
        if not self.node:
            raise ValueError("--cluster needs --node NAME (this node's name in the cluster)")
        url = self.advertise
        if url is None:
            if self.port == 0:
                raise ValueError("--cluster with --port 0 needs --advertise URL: other nodes must know where to reach it")
            url = f"http://{self.host}:{self.port}"
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"--advertise must be an http:// or https:// URL, got {url!r}")
        return NodeConfig(self.node, url.rstrip("/"), tuple(endpoints), self.cluster_prefix, self.partitions,
                          self.replicas, self.lease_ttl_s, self.cluster_initial_nodes, self.replica_replace_after_s,
                          self.cluster_token, auto_rebalance=self.cluster_auto_rebalance)

    def engine_config(self) -> EngineConfig:
        """The engine's half of these settings."""
        return EngineConfig(
            data_dir=Path(self.data_dir),
            partitions=self.partitions,
            flush_interval_ms=self.flush_interval_ms,
            max_key_bytes=self.max_key_bytes,
            max_value_bytes=self.max_value_bytes,
            queue_memory_limit_bytes=self.queue_memory_limit_mb * MiB,
            flush_failure_backlog_bytes=self.flush_failure_backlog_bytes,
        )
