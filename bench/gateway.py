"""Gateway bench (DESIGN.md §8): direct upstream vs bare aiohttp relay vs agl-lite (vs LiteLLM), in one run.

Every server runs in its own process, hey in another; all cells are measured side by side, interleaved in rounds.
Run: `.venv/bin/python bench/gateway.py [--quick] [--markdown] [--profile]` (needs `hey`). Results are only
comparable within one run: the figures that matter are ratios (vs the relay) and differences (vs direct).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from loadgen import HEY_MISSING, Cell, hey_path, run_hey
from procs import Children, Placement, bench_main
from report import CONCURRENCY, Cells, build_rows, machine, markdown_table, text_table, verdict
from servers import (
    DEFAULT_CHAIN,
    LITELLM_SKIP,
    MODES,
    STREAM_EVENTS,
    Target,
    check_answers,
    request_body,
    scans_of,
    start_agl_lite,
    start_litellm,
    start_relay,
    start_upstream,
)
from spy import py_spy_path, record, summarise

STREAM_WRITES = 6
"""The upstream sends its 25 SSE events in 6 writes: on 2 CPUs, where hey and the upstream share one, a write
per event makes the load side too slow to stay >= 2x the relay (the bench would be INVALID). 8 writes, the default
until 2026-12-05, left the stream cell INVALID in every run that day (direct 1.7-1.8x the relay). At c=32 the
upstream's writes coalesce while the server under test is busy (agl-lite read the 8 writes as 1.46 reads on average),
so the count changes the load side's cost more than the servers'."""


def measure(hey: str, target: Target, mode: str, concurrency: int, seconds: float, cpus: Placement) -> Cell:
    return run_hey(
        hey,
        target.url,
        request_body(mode, target.api),
        concurrency=concurrency,
        seconds=seconds,
        headers=target.headers,
        affinity=cpus.load,
        server_pid=target.pid,
    )


# --- the run ---------------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="~1.5 s per cell, one round (a smoke run, noisy).")
    p.add_argument(
        "--markdown", action="store_true", help="Also print the table as markdown, with the machine."
    )
    p.add_argument(
        "--seconds", type=float, help="Seconds per cell, all rounds together (default 5; quick 1.5)."
    )
    p.add_argument(
        "--rounds", type=int, help="Interleaved rounds per cell, against drift (default 4; quick 1)."
    )
    p.add_argument(
        "--no-pin", action="store_true", help="Do not pin the server under test and the load side to CPUs."
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="Afterwards, py-spy agl-lite under load (c=32, both modes) and print where the time goes.",
    )
    p.add_argument(
        "--stream-writes",
        type=int,
        default=STREAM_WRITES,
        help=f"Writes per streamed answer from the upstream, 1-{STREAM_EVENTS} (default {STREAM_WRITES}).",
    )
    p.add_argument(
        "--keep-logs", action="store_true", help="Keep the servers' logs and configs; print where."
    )
    p.add_argument(
        "--chain",
        default=",".join(DEFAULT_CHAIN),
        help=f"agl-lite's addon chain, comma-separated (default {','.join(DEFAULT_CHAIN)}); with `store` in "
        "it, the default SQLite store in the temp dir (e.g. the full capture chain "
        "store,auth,store_api,control,metrics,route,capture,tokens,sink).",
    )
    p.add_argument(
        "--responses",
        action="store_true",
        help="Also ask agl-lite the same question through the Responses API (`agl-lite/responses`: translated to "
        "chat completions upstream), in the same rounds: what the translation costs against the same relay.",
    )
    p.add_argument(
        "--baseline",
        type=Path,
        metavar="DIR",
        help="Also run the agl-lite of another checkout (e.g. `git worktree add /tmp/base HEAD~1`), as "
        "`agl-lite@base`, in the same interleaved rounds: an A/B of two builds against one relay. A worktree has no "
        "C scans until built there (`python setup.py build_ext --inplace`); the header says which each one ran.",
    )
    p.add_argument(
        "--agent-path",
        action="store_true",
        help="Send agl-lite's calls on the agent path (/r/{rollout}/a/{attempt}/v1, the agent key) as agents do, "
        "not as unattributed admin calls; needs store and store_api in the chain.",
    )
    return p.parse_args(argv)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run(args: argparse.Namespace, hey: str, tmp: Path) -> int:
    seconds = args.seconds or (1.5 if args.quick else 5.0)
    rounds = max(1, args.rounds or (1 if args.quick else 4))
    warmup = 0.5 if args.quick else 1.0
    cpus = Placement.choose(pin=not args.no_pin)
    chain = tuple(name.strip() for name in args.chain.split(",") if name.strip())
    info = machine()
    with Children(tmp) as children:
        log(f"starting the upstream, the bare relay and agl-lite ({cpus.describe()}) ...")
        direct = start_upstream(children, args.stream_writes, cpus.load)
        base = direct.url.removesuffix("/v1/chat/completions")
        targets = [
            direct,
            start_relay(children, base, cpus.server),
            start_agl_lite(children, base, tmp, cpus.server, chain, agent_path=args.agent_path),
        ]
        if args.responses:
            agl = targets[2]
            url = agl.url.replace("/chat/completions", "/responses")
            targets.append(Target("agl-lite/responses", url, agl.headers, pid=agl.pid, api="responses"))
        if args.baseline is not None:
            home = tmp / "baseline"
            home.mkdir()
            targets.append(
                start_agl_lite(
                    children,
                    base,
                    home,
                    cpus.server,
                    chain,
                    agent_path=args.agent_path,
                    source=args.baseline.resolve(),
                    name="agl-lite@base",
                )
            )
        litellm = start_litellm(children, base, tmp, cpus.server)
        if litellm is not None:
            targets.append(litellm)
        else:
            log(f"litellm: {LITELLM_SKIP}")
        for t in targets:
            check_answers(t)
            for mode in MODES:
                measure(hey, t, mode, max(CONCURRENCY), warmup, cpus)
        log(
            f"measuring {len(targets)} targets x {len(MODES)} modes x {len(CONCURRENCY)} concurrencies, "
            f"{seconds:g} s per cell in {rounds} interleaved round(s) ..."
        )
        cells: Cells = {}
        for mode in MODES:
            for c in CONCURRENCY:
                for _ in range(rounds):
                    for t in targets:
                        cell = measure(hey, t, mode, c, seconds / rounds, cpus)
                        cells.setdefault((t.name, mode, c), Cell()).add(cell)
        rows = build_rows(cells, targets)
        lines, valid = verdict(cells, litellm is not None)
        if args.baseline is not None:
            lines += ab_lines(cells)
        if args.responses:
            lines += responses_lines(cells)
        setup = (
            f"{seconds:g} s per cell in {rounds} interleaved round(s); hey -cpus 1; {cpus.describe()}; "
            f"upstream stream in {args.stream_writes} writes; agl-lite chain {', '.join(chain)}"
            + ("; agl-lite called on the agent path with the agent key" if args.agent_path else "")
            + (
                f"; agl-lite@base from {args.baseline} ({scans_of(args.baseline.resolve())})"
                if args.baseline is not None
                else ""
            )
            + (
                "; agl-lite/responses: the same server asked through the Responses API"
                if args.responses
                else ""
            )
        )
        notes = [
            f"{info['nproc']} CPUs: absolute figures are low and noisy on such a box; compare within this run only "
            "(ratios to the relay, differences to direct).",
            "direct = what the load side (hey + upstream) delivers: the ceiling of every other row.",
            "latencies: hey reports 0.1 ms resolution; p50/p99 over all requests of the cell.",
        ]
        if litellm is None:
            notes.append(f"litellm: {LITELLM_SKIP}")
        print()
        print(
            f"gateway bench  {info['date']}  {info['nproc']} CPUs {info['cpu']}  Python {info['python']}  "
            f"aiohttp {info['aiohttp']}  agl-lite {info['agl-lite']}\n{setup}"
        )
        print(text_table(rows))
        print()
        print("\n".join(lines))
        print("\n".join("note: " + n for n in notes))
        if args.markdown:
            print()
            print(
                f"**{info['date']}** — `nproc` {info['nproc']}, {info['cpu']}, {info['os']}, "
                f"Python {info['python']}, aiohttp {info['aiohttp']}, agl-lite {info['agl-lite']}; {setup}.\n"
            )
            print(markdown_table(rows))
            print()
            print("```\n" + "\n".join(lines) + "\n```")
        if args.profile:
            profile(hey, targets[2], tmp, seconds, cpus)
    return 0 if valid else 3


def responses_lines(cells: Cells) -> list[str]:
    """The Responses API's cost: agl-lite asked through it against agl-lite asked through chat, and the relay."""
    top, out = max(CONCURRENCY), []
    for mode in MODES:
        resp, chat, relay = (cells[(t, mode, top)] for t in ("agl-lite/responses", "agl-lite", "bare relay"))
        one, one_direct = cells[("agl-lite/responses", mode, 1)], cells[("direct", mode, 1)]
        out.append(
            f"responses {mode:<6} c={top}: {resp.rps / relay.rps:.2f}x relay, {resp.rps / chat.rps:.2f}x agl-lite's "
            f"chat; c=1 added p50 +{one.percentile(50) - one_direct.percentile(50):.1f} ms, p99 "
            f"+{one.percentile(99) - one_direct.percentile(99):.1f} ms"
        )
    return out


def ab_lines(cells: Cells) -> list[str]:
    """agl-lite against agl-lite@base at c=32: req/s and CPU per request, round by round against the same relay."""
    top, out = max(CONCURRENCY), []
    for mode in MODES:
        new, old, relay = (cells[(t, mode, top)] for t in ("agl-lite", "agl-lite@base", "bare relay"))
        paired = [
            (n / r, o / r)
            for n, o, r in zip(new.rounds_rps, old.rounds_rps, relay.rounds_rps, strict=True)
            if r
        ]
        spread = ", ".join(f"{n:.2f}/{o:.2f}" for n, o in paired)
        out.append(
            f"a/b      {mode:<6} c={top}: agl-lite {new.rps / relay.rps:.3f}x relay, agl-lite@base "
            f"{old.rps / relay.rps:.3f}x; CPU per request {new.cpu_us_per_request:.0f} vs "
            f"{old.cpu_us_per_request:.0f} µs (rounds new/base vs relay: {spread})"
        )
    return out


def profile(hey: str, target: Target, tmp: Path, seconds: float, cpus: Placement) -> None:
    spy = py_spy_path()
    if spy is None or target.pid is None:
        print("\nprofile: py-spy not found (pip install py-spy)")
        return
    for mode in MODES:
        out = tmp / f"profile-{mode}.txt"

        def load(m: str = mode) -> None:
            measure(hey, target, m, max(CONCURRENCY), seconds + 1, cpus)

        print(f"\nprofile of {target.name} (pid {target.pid}), {mode}, c=32, {seconds:g} s:")
        try:
            record(spy, target.pid, seconds, out, load)
        except (RuntimeError, OSError) as exc:
            print(f"  py-spy failed: {exc}")
            continue
        print("\n".join(summarise(out)))


def main() -> int:
    return bench_main("gateway bench", run, parse_args(), hey_path(), HEY_MISSING, "agl-bench-")


if __name__ == "__main__":
    sys.exit(main())
