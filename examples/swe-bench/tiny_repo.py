"""Build the tiny git repository that `instances.jsonl`'s two self-written SWE-bench instances are about.

SWE-bench's own data and images cannot be fetched everywhere (not where the tests run), so the example ships two
instances of the same shape about `agl-lite/tiny-calc`, a repository this script creates. Commits are made with
fixed authors and dates, so their ids are the same on every machine and `instances.jsonl` can name them.

    python tiny_repo.py DIR        # creates DIR/agl-lite/tiny-calc (the layout `algorithm.py --repos DIR` reads)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

REPO = "agl-lite/tiny-calc"

CALC_V1 = '''"""Arithmetic on two numbers."""


def add(a, b):
    return a - b


def sub(a, b):
    return a - b
'''

CALC_V2 = '''"""Arithmetic on two numbers."""


def add(a, b):
    return a + b


def sub(a, b):
    return a - b
'''

STATS_V2 = '''"""Statistics on lists of numbers."""


def mean(xs):
    return sum(xs) // len(xs)
'''

TESTS_V1 = """from calc import add, sub


def test_sub():
    assert sub(5, 3) == 2
"""

TESTS_V2 = """from calc import add, sub


def test_sub():
    assert sub(5, 3) == 2


def test_add():
    assert add(2, 3) == 5
"""

README = "# tiny-calc\n\nThe repository of agl-lite's self-written SWE-bench instances.\n"
PYTEST_INI = "[pytest]\npythonpath = .\n"

# Each commit: (message, files written, date). The first is instance 1's base, the second instance 2's.
COMMITS = [
    (
        "tiny-calc: add and sub",
        {"README.md": README, "pytest.ini": PYTEST_INI, "calc.py": CALC_V1, "tests/test_calc.py": TESTS_V1},
        "2024-01-01T00:00:00+00:00",
    ),
    (
        "Fix add; add stats.mean",
        {"calc.py": CALC_V2, "tests/test_calc.py": TESTS_V2, "stats.py": STATS_V2},
        "2024-01-02T00:00:00+00:00",
    ),
]


def _git(repo: Path, *args: str, date: str = "") -> str:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(repo),  # no user or system config can change the commits (signing, hooks, eol)
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_AUTHOR_NAME": "agl-lite",
        "GIT_AUTHOR_EMAIL": "agl-lite@example.invalid",
        "GIT_COMMITTER_NAME": "agl-lite",
        "GIT_COMMITTER_EMAIL": "agl-lite@example.invalid",
        "GIT_AUTHOR_DATE": date,
        "GIT_COMMITTER_DATE": date,
    }
    done = subprocess.run(
        ["git", "-C", str(repo), *args], env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"git {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout.strip()


def build(root: Path) -> tuple[Path, list[str]]:
    """Create `root/agl-lite/tiny-calc`; returns its path and its commit ids, oldest first."""
    repo = root / REPO
    if repo.exists():
        raise SystemExit(f"{repo} exists already; give an empty directory")
    repo.mkdir(parents=True)
    _git(repo, "init", "--quiet", "--initial-branch=main")
    commits = []
    for message, files, date in COMMITS:
        for name, text in files.items():
            path = repo / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        _git(repo, "add", "--all")
        _git(repo, "commit", "--quiet", "--no-verify", "-m", message, date=date)
        commits.append(_git(repo, "rev-parse", "HEAD"))
    return repo, commits


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "root", type=Path, help="Directory to create the repository under (as ROOT/agl-lite/tiny-calc)."
    )
    args = p.parse_args(argv)
    repo, commits = build(args.root)
    print(repo)
    for commit in commits:
        print(commit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
