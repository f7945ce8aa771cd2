"""The addon authors' testing kit: a lifecycle with parsed options, a driver for taps and transforms, a recorder."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from multidict import CIMultiDict

from agl_lite.capture.strip import StreamStripper, Strip
from agl_lite.core.config import GatewayConfig, option
from agl_lite.core.flow import Flow, Response
from agl_lite.errors import ConfigError
from agl_lite.service import running_gateway
from agl_lite.testing import MockVLLM, running_mock
from agl_lite.testing.addons import FlowRecorder, configured, drive
from agl_lite.testing.flows import make_flow
from agl_lite.testing.gateway import write_config
from tests.conftest import ADMIN_KEY


class Counting:
    @dataclass(frozen=True, slots=True)
    class Options:
        every: int = option(1, "Count every n-th chunk.")

    def __init__(self, options: Counting.Options | None = None) -> None:
        self.options = options
        self.loaded = False

    def load(self, ctx: object) -> None:
        self.loaded = True

    def configure(self, config: GatewayConfig, options: Counting.Options) -> None:
        self.options = options


async def test_configured_runs_load_and_configure_with_options_parsed_as_the_gateway_does() -> None:
    addon = await configured(Counting(), {"every": 3})
    assert addon.loaded
    assert addon.options == Counting.Options(every=3)
    assert (await configured(Counting())).options == Counting.Options()
    built = Counting.Options(every=5)
    assert (await configured(Counting(built))).options is built  # an instance keeps what it was built with
    assert (await configured(Counting(built), {"every": 2})).options == Counting.Options(every=2)
    with pytest.raises(ConfigError, match=r"unknown key '.*Counting\.evry' \(did you mean 'every'\?\)"):
        await configured(Counting(), {"evry": 3})
    with pytest.raises(ConfigError, match="must be an integer"):
        await configured(Counting(), {"every": "3"})


def test_drive_feeds_taps_and_transforms_in_order_and_flushes_what_they_hold() -> None:
    flow: Flow = make_flow("GET", "/healthz")  # (any flow: the driver only needs its response)
    flow.response = resp = Response(200, CIMultiDict(), is_event_stream=True, from_upstream=True)
    seen: list[bytes] = []
    resp.taps.append(seen.append)
    resp.transforms.append(StreamStripper(Strip(token_ids=True), chat=True))
    event = b'data: {"choices":[{"index":0,"token_ids":[1,2]}]}\n\n'
    out = drive(
        flow, [event[:20], event[20:], b"data: [DONE]"]
    )  # the last event unfinished: held, then flushed
    assert seen == [event[:20], event[20:], b"data: [DONE]"]  # the upstream's bytes, untouched
    assert out == b'data: {"choices":[{"index":0,"token_ids":null}]}\n\ndata: [DONE]'


async def test_the_recorder_hands_over_the_record_of_the_one_flow(tmp_path: Path) -> None:
    import openai

    recorder = FlowRecorder()
    async with running_mock(MockVLLM(("smollm2",))) as url:
        config = write_config(tmp_path, {"smollm2": [url]}, chain=("auth", "route", "capture"))
        async with running_gateway(config, extra_addons=[recorder]) as gw:
            client = openai.AsyncOpenAI(
                base_url=f"http://127.0.0.1:{gw.port}/v1", api_key=ADMIN_KEY, max_retries=0
            )
            reply = await client.chat.completions.create(
                model="smollm2", messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
            record = await recorder.record()
            assert record.response_id == reply.id
            assert record.choices[0].token_ids
            await client.models.list()  # a second finished flow: "the one flow" is now ambiguous
            await recorder.wait(2)
            with pytest.raises(AssertionError, match="2 flows finished where one was expected"):
                await recorder.record()
            with pytest.raises(AssertionError, match="flow 2 has no captured call"):
                await recorder.record(2)
