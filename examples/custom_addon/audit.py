"""An example addon: one JSON line per LLM call (model, status, stream events, duration) appended to a file.

Load it with `chain = ["auth", "route", "audit:Audit"]` and `PYTHONPATH` pointing at this folder; see README.md.
It shows the three things most addons do: options, a cheap per-flow tap, and per-flow accounting in `flow_done`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from agl_lite.addon import Flow, GatewayConfig, RouteKind, SSEParser, option


class Audit:
    @dataclass(frozen=True, slots=True)
    class Options:
        path: str = option("audit.jsonl", "File the lines are appended to, relative to the config file.")

    _out: IO[str] | None = None

    def configure(self, config: GatewayConfig, options: Audit.Options) -> None:
        self._out = (config.base_dir / Path(options.path)).open("a", buffering=1)

    def response_headers(self, flow: Flow) -> None:
        if flow.route.kind is not RouteKind.LLM or flow.response is None or not flow.response.is_event_stream:
            return
        parser = SSEParser()
        counter = {"events": 0}

        def tap(chunk: bytes) -> None:  # sees upstream bytes as they pass; never delays them
            counter["events"] += len(parser.feed(chunk))

        flow.response.taps.append(tap)
        flow.metadata["audit.counter"] = counter

    def flow_done(self, flow: Flow) -> None:
        if flow.route.kind is not RouteKind.LLM or self._out is None:
            return
        line: dict[str, Any] = {
            "time": round(time.time(), 3),
            "model": flow.metadata.get("route.requested_model"),
            "rollout": flow.metadata.get("auth.rollout_id"),
            "status": flow.response.status if flow.response else None,
            "stream_events": flow.metadata.get("audit.counter", {}).get("events"),
            "error": flow.error.type if flow.error else None,
            "ms": round(((flow.t_end or flow.t_start) - flow.t_start) * 1000, 2),
        }
        self._out.write(json.dumps(line) + "\n")

    def shutdown(self) -> None:
        if self._out is not None:
            self._out.close()
