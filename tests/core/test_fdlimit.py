"""The open-files limit is raised at start-up (issue #15 M8), in a child process so the test's own stays as it is."""

from __future__ import annotations

import resource
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import resource, sys
    from agl_lite.core.fdlimit import raise_nofile
    soft, hard = int(sys.argv[1]), int(sys.argv[2])
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    print(raise_nofile(int(sys.argv[3])), resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    """
)


def run(soft: int, hard: int, connections: int) -> tuple[list[int], str]:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(soft), str(hard), str(connections)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return [int(x) for x in out.stdout.strip().splitlines()[-1].split()], out.stdout + out.stderr


HARD = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
NEEDED = 2 * 2048 + 4096


@pytest.mark.skipif(HARD != resource.RLIM_INFINITY and HARD < NEEDED, reason="the hard limit here is too low")
def test_a_low_soft_limit_is_raised_to_what_the_caps_need() -> None:
    (returned, now), _ = run(1024, HARD, 2048)
    assert returned == now == NEEDED


def test_a_hard_limit_below_the_need_is_used_whole_and_warned_about() -> None:
    (returned, now), output = run(512, 2000, 2048)
    assert returned == now == 2000
    assert "open-files limit is below" in output


def test_a_limit_already_high_enough_is_left_alone() -> None:
    (returned, now), _ = run(5000, 6000, 10)
    assert returned == now == 5000


@pytest.mark.parametrize("soft", [256, 1024])
@pytest.mark.skipif(HARD != resource.RLIM_INFINITY and HARD < NEEDED, reason="the hard limit here is too low")
def test_the_gateway_raises_it_when_it_starts(soft: int) -> None:
    script = textwrap.dedent(
        f"""
        import asyncio, os, resource, tempfile
        from pathlib import Path
        os.environ["AGL_KEY"] = "k" * 32
        resource.setrlimit(resource.RLIMIT_NOFILE, ({soft}, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        from agl_lite.service import running_gateway
        from agl_lite.testing.gateway import write_config
        async def main():
            config = write_config(Path(tempfile.mkdtemp()), {{"m": ["http://127.0.0.1:9/v1"]}})
            async with running_gateway(config):
                print(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        asyncio.run(main())
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    assert int(out.stdout.strip().splitlines()[-1]) >= NEEDED
