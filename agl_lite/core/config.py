"""Config: one TOML file parsed once into frozen dataclasses; unknown keys and bad values are errors naming both.

Every field has a default and a doc (`option(default, doc)`), from which docs/configuration.md is generated
(`python -m agl_lite.core.config`). Addons declare their own `Options` dataclass; its table is `[addons.NAME]`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import enum
import tomllib
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from agl_lite.errors import ConfigError

__all__ = [
    "GatewayConfig",
    "LogConfig",
    "ServerConfig",
    "UpstreamConfig",
    "extra_position",
    "load_config",
    "load_toml",
    "option",
    "parse_dataclass",
]

T = TypeVar("T")

MiB = 1024 * 1024


def extra_position(chain: Sequence[str]) -> int:
    """Where added addons (`[addons] extra`, `extra_addons`) go in a chain: right before `sink`, so that they may
    still change the captured call before it is committed; at the end of a chain without one."""
    return chain.index("sink") if "sink" in chain else len(chain)


def option(default: Any, doc: str, *, toml_key: str = "") -> Any:
    """A config field with its default and a one-line doc (units included); tables default to read-only copies.

    `toml_key` is where the field is written in the file when that differs from its name (for the docs).
    """
    meta = {"doc": doc, "toml_key": toml_key}
    if isinstance(default, Mapping):
        frozen = types.MappingProxyType(dict(default))
        return field(default_factory=lambda: frozen, metadata={**meta, "default": frozen})
    return field(default=default, metadata=meta)


@dataclass(frozen=True, slots=True)
class ServerConfig:
    host: str = option(
        "127.0.0.1", "Address to listen on; `0.0.0.0` to be reachable from pods or containers."
    )
    port: int = option(8100, "TCP port to listen on; 0 picks a free port.")
    public_url: str = option("", "Base URL agents use to reach the gateway; empty means `http://HOST:PORT`.")
    max_body_bytes: int = option(64 * MiB, "Largest request body accepted, in bytes; larger bodies get 413.")
    header_timeout_s: float = option(
        60.0,
        "Seconds a connection may take to send a request's headers (and stay idle between requests); then it "
        "is closed.",
    )
    body_timeout_s: float = option(
        60.0, "Seconds a request's body may take to arrive once its headers are in; slower bodies get 408."
    )
    shutdown_timeout: float = option(10.0, "Seconds to let in-flight requests finish at shutdown.")
    workers: int = option(
        1,
        "Gateway processes serving this port together (`agl-lite run --workers N` overrides it). More than one "
        "needs the store on PostgreSQL (`addons.store.dsn`) and no runner in the chain; each binds the port with "
        "SO_REUSEPORT, and the kernel spreads the connections.",
    )
    event_loop: Literal["uvloop", "asyncio"] = option(
        "uvloop",
        "`agl-lite run`'s event loop: `uvloop` (libuv; less CPU per request) or the standard `asyncio` loop.",
    )


@dataclass(frozen=True, slots=True)
class UpstreamConfig:
    connect_timeout: float = option(10.0, "Seconds to open a TCP connection to an upstream.")
    read_timeout: float = option(
        600.0,
        "Longest silence from an upstream (before headers or between chunks), in seconds; no total cap. Checked "
        "every second (every quarter of it when shorter), so it fires up to that much late.",
    )
    max_connections: int = option(2048, "Upper bound on open upstream connections (all upstreams together).")
    keepalive_timeout: float = option(
        30.0,
        "Seconds an idle upstream connection is kept for reuse (checked with `read_timeout`); 0: none is.",
    )
    max_event_bytes: int = option(
        32 * MiB,
        "Largest event of an upstream event stream (its lines up to its blank line), and largest plain body, "
        "relayed; past it the call fails (capture and the translations hold each whole, so this bounds a call's "
        "memory).",
    )
    retry_on_status: tuple[int, ...] = option(
        (502, 503),
        "Upstream statuses retried on the next upstream (only before any byte reached the client).",
    )


@dataclass(frozen=True, slots=True)
class LogConfig:
    level: Literal["debug", "info", "warning", "error"] = option("info", "Lowest level logged.")
    format: Literal["console", "json"] = option("console", "`console` for people, `json` for log shippers.")
    access_log: bool = option(False, "Log one INFO line per flow (method, path, status, duration).")


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    server: ServerConfig = option(ServerConfig(), "The HTTP server.")
    upstream: UpstreamConfig = option(UpstreamConfig(), "Forwarding to inference servers.")
    log: LogConfig = option(LogConfig(), "Logging.")
    routes: str = option("routes.toml", "Model routes file, relative to this config file.")
    chain: tuple[str, ...] | None = option(
        None,
        "Addons in order: short names or `module:Class` strings; when the file names none, the default chain "
        "(`agl_lite.addons.DEFAULT_CHAIN`).",
        toml_key="addons.chain",
    )
    extra: tuple[str, ...] = option(
        (),
        "Addons added to `chain` (the default one, or yours) right before its `sink`, or at its end without one: "
        "the default chain plus yours, each still able to change the captured call before it is committed.",
        toml_key="addons.extra",
    )
    addons: Mapping[str, Mapping[str, Any]] = option(
        {}, "Per-addon option tables, checked by each addon's `Options`.", toml_key="addons.NAME"
    )
    source: str = option("<defaults>", "The file this config was read from (set by the loader).")

    @property
    def full_chain(self) -> tuple[str, ...]:
        """`chain` with `extra` in its place: what the gateway loads (the default chain is the loader's to give:
        `with_chain`)."""
        chain = self.chain or ()
        if not self.extra:
            return chain
        at = extra_position(chain)
        return (*chain[:at], *self.extra, *chain[at:])

    def with_chain(self, default: Sequence[str]) -> GatewayConfig:
        """This config, with `default` as its chain when it names none; its `[addons.NAME]` tables checked
        against the chain."""
        config = self if self.chain is not None else dataclasses.replace(self, chain=tuple(default))
        unknown = set(config.addons) - set(config.full_chain)
        if unknown:
            raise ConfigError(
                f"{config.source}: [addons.{sorted(unknown)[0]}] configures an addon that is not in addons.chain "
                f"{list(config.full_chain)}"
            )
        return config

    @property
    def base_dir(self) -> Path:
        return Path(self.source).parent if self.source != "<defaults>" else Path.cwd()

    @property
    def routes_path(self) -> Path:
        return self.base_dir / self.routes

    @property
    def public_url(self) -> str:
        if self.server.public_url:
            return self.server.public_url.rstrip("/")
        host = "127.0.0.1" if self.server.host in ("0.0.0.0", "::", "") else self.server.host
        return f"http://{host}:{self.server.port}"


def load_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML file; a missing or malformed file is a ConfigError naming it."""
    p = Path(path)
    try:
        with p.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {p}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: invalid TOML: {exc}") from exc
    except UnicodeDecodeError as exc:  # TOML is UTF-8 text; tomllib lets the decoding error through
        raise ConfigError(f"{p}: not UTF-8 text (byte {exc.start}): save it as UTF-8") from exc
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read: {exc.strerror}") from exc


def load_config(path: str | Path, *, default_chain: Sequence[str] | None = None) -> GatewayConfig:
    """Load agl-lite.toml; the `[addons]` table holds `chain` (`default_chain` when it has none), `extra` and the
    per-addon tables, each checked against the chain (later, by `with_chain`, when there is none yet)."""
    data = load_toml(path)
    addons = data.pop("addons", {})
    if not isinstance(addons, dict):
        raise ConfigError(f"{path}: [addons] must be a table")
    addons = dict(addons)
    for key in ("chain", "extra"):
        if key in addons:
            data[key] = addons.pop(key)
    for name, table in addons.items():
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: addons.{name} must be a table of options")
    data["addons"] = addons
    data["source"] = str(path)
    config = parse_dataclass(GatewayConfig, data, file=str(path))
    if config.chain is None and default_chain is None:
        return config  # the builder gives the default chain, and checks the tables then
    return config.with_chain(default_chain or ())


# --- the converter -------------------------------------------------------------------------------------------------


def parse_dataclass(cls: type[T], data: Mapping[str, Any], *, file: str, where: str = "") -> T:
    """Build the frozen dataclass `cls` from a TOML table, checking every key and value."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{file}: {where or 'top level'} must be a table, got {_describe(data)}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{where}.{key}" if where else key
        if key not in fields:
            close = difflib.get_close_matches(key, list(fields), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else f"; known keys: {', '.join(sorted(fields))}"
            raise ConfigError(f"{file}: unknown key {dotted!r}{hint}")
        kwargs[key] = _convert(hints[key], value, file=file, where=dotted)
    return cls(**kwargs)


def _describe(value: Any) -> str:
    return f"{type(value).__name__} {value!r}" if not isinstance(value, dict | list) else type(value).__name__


_SCALARS: dict[Any, Any] = {bool: bool, int: int, float: int | float, str: str}
"""What a config value of each scalar type may be given as."""


def _convert(tp: Any, value: Any, *, file: str, where: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    bad = ConfigError(f"{file}: {where} must be {_type_name(tp)}, got {_describe(value)}")
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is not type(None):
                with contextlib.suppress(ConfigError):
                    return _convert(arg, value, file=file, where=where)
        raise bad
    if origin is Literal:
        if value in args:
            return value
        raise ConfigError(f"{file}: {where} must be one of {', '.join(repr(a) for a in args)}, got {value!r}")
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return parse_dataclass(tp, value, file=file, where=where)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(value)
        except ValueError:
            choices = ", ".join(repr(m.value) for m in tp)
            raise ConfigError(f"{file}: {where} must be one of {choices}, got {value!r}") from None
    if tp in _SCALARS:
        # (bool is an int to Python, not to a config file)
        if not isinstance(value, _SCALARS[tp]) or (tp is not bool and isinstance(value, bool)):
            raise bad
        return float(value) if tp is float else value
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise bad
        item = args[0] if args else Any
        return tuple(_convert(item, v, file=file, where=f"{where}[{i}]") for i, v in enumerate(value))
    if origin in (Mapping, dict, typing.Mapping) or tp in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise bad
        vt = args[1] if len(args) == 2 else Any
        return types.MappingProxyType(
            {str(k): _convert(vt, v, file=file, where=f"{where}.{k}") for k, v in value.items()}
        )
    raise ConfigError(f"{file}: {where}: unsupported option type {tp!r}")  # a bug in an Options class


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is tuple:
        return f"a list of {_type_name(args[0])}"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in args if a is not type(None))
    if dataclasses.is_dataclass(tp):
        return "a table"
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}
    return names.get(tp, getattr(tp, "__name__", str(tp)))


def reference_markdown(cls: type[Any], prefix: str = "", defaults: Mapping[str, Any] | None = None) -> str:
    """A table of every option of `cls` (recursing into nested tables) for docs/configuration.md; `defaults`
    (by TOML key) for the options whose default the loader hands in (`addons.chain`)."""
    rows: list[str] = []
    nested: list[str] = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name == "source":
            continue
        tp = hints[f.name]
        key = f.metadata.get("toml_key") or f"{prefix}{f.name}"
        if dataclasses.is_dataclass(tp) and isinstance(tp, type):
            nested.append(f"\n### `[{key}]`\n\n{f.metadata.get('doc', '')}\n\n" + reference_markdown(tp, ""))
            continue
        default = (defaults or {}).get(key, f.metadata.get("default", f.default))
        if isinstance(default, types.MappingProxyType):
            default = dict(default)
        if isinstance(default, tuple):
            default = list(default)
        if isinstance(default, enum.Enum):
            default = default.value
        rows.append(f"| `{key}` | `{default!r}` | {f.metadata.get('doc', '')} |")
    table = "| key | default | meaning |\n|---|---|---|\n" + "\n".join(rows) + "\n" if rows else ""
    return table + "".join(nested)


if __name__ == "__main__":
    print(reference_markdown(GatewayConfig), end="")
