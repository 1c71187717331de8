"""Where the whole suite's time goes: one pytest run with ``--durations=0``, every test's time summed
by file and by folder, with the number of Python interpreters each file starts.

    .venv/bin/python scripts/suite_durations.py --out tests/durations.md   # the whole suite
    .venv/bin/python scripts/suite_durations.py --out /tmp/d.md tests/compat   # a selection

Interpreters are counted by a ``.pth`` file put into the environment's site-packages for the run
(and removed after it): every interpreter of that environment (a test's subprocess, torchrun's
agent and its workers) appends its pid, its parent's pid and the test running (pytest's
``PYTEST_CURRENT_TEST``, inherited by every child) to a log. A process whose environment lost the
variable is counted for the test of its nearest counted ancestor. The pytest process itself is
not counted.
"""

from __future__ import annotations

import argparse
import os
import re
import site
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
HOOK_NAME = "_suite_durations_count.pth"
HOOK = (
    "import os; p = os.environ.get('SUITE_DURATIONS_LOG'); "
    "p and open(p, 'a').write('%d\\t%d\\t%s\\n' % (os.getpid(), os.getppid(), "
    "os.environ.get('PYTEST_CURRENT_TEST', '')))\n"
)
DURATION_LINE = re.compile(r"^\s*([\d.]+)s (setup|call|teardown)\s+(\S+?)::")
SUMMARY_LINE = re.compile(r"^=* ?(\d+ (?:passed|failed|error|skipped).*) in ([\d.]+)s")


def run_pytest(pytest_args: list[str], log: Path) -> tuple[str, float, int]:
    site_packages = Path(site.getsitepackages()[0])
    hook = site_packages / HOOK_NAME
    hook.write_text(HOOK)
    env = {**os.environ, "SUITE_DURATIONS_LOG": str(log)}
    start = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "--durations=0", "--durations-min=0", *pytest_args],
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    finally:
        hook.unlink()
    return done.stdout, time.monotonic() - start, done.returncode


def interpreters_by_file(log: Path, pytest_pid_parents: set[int]) -> dict[str, int]:
    """Counts each logged interpreter for the file of its test (or of its nearest counted ancestor)."""
    rows = [line.split("\t") for line in log.read_text().splitlines() if line.strip()] if log.exists() else []
    test_of = {int(pid): test for pid, _, test in rows}
    parent_of = {int(pid): int(ppid) for pid, ppid, _ in rows}
    counts: dict[str, int] = defaultdict(int)
    for pid, _, test in rows:
        current, seen = int(pid), set()
        while not test_of.get(current) and current in parent_of and current not in seen:
            seen.add(current)
            current = parent_of[current]
        test = test_of.get(current, "")
        if not test and parent_of.get(int(pid)) in pytest_pid_parents:
            continue  # the pytest process itself
        counts[test.split("::")[0] if test else "(no test)"] += 1
    return counts


def table(output: str, interpreters: dict[str, int]) -> tuple[str, float]:
    by_file: dict[str, float] = defaultdict(float)
    tests: dict[str, set[str]] = defaultdict(set)
    for line in output.splitlines():
        if match := DURATION_LINE.match(line):
            seconds, _, path = match.groups()
            by_file[path] += float(seconds)
            tests[path].add(line.split(None, 2)[2].strip())
    by_folder: dict[str, list[float]] = defaultdict(lambda: [0.0, 0, 0])  # seconds, tests, interpreters
    lines = ["| file | tests | seconds | interpreters started |", "| --- | ---: | ---: | ---: |"]
    for path in sorted(by_file, key=by_file.get, reverse=True):  # type: ignore[arg-type]
        count = interpreters.get(path, 0)
        lines.append(f"| `{path}` | {len(tests[path])} | {by_file[path]:.1f} | {count} |")
        folder = "/".join(path.split("/")[:2])
        by_folder[folder][0] += by_file[path]
        by_folder[folder][1] += len(tests[path])
        by_folder[folder][2] += count
    folders = [
        "| folder | tests | seconds | minutes | interpreters started |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for folder, (seconds, count, started) in sorted(by_folder.items(), key=lambda kv: -kv[1][0]):
        folders.append(f"| `{folder}` | {count} | {seconds:.0f} | {seconds / 60:.1f} | {started} |")
    total_s = sum(by_file.values())
    total_i = sum(interpreters.values())
    folders.append(
        f"| **all** | {sum(len(t) for t in tests.values())} | {total_s:.0f} | {total_s / 60:.1f} | {total_i} |"
    )
    return "\n".join(folders) + "\n\n" + "\n".join(lines) + "\n", total_s


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="the markdown file to write")
    parser.add_argument("--title", default="Test durations", help="the heading of the file")
    parser.add_argument("--raw", type=Path, help="where to keep pytest's whole output (optional)")
    args, pytest_args = parser.parse_known_args()
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "interpreters.log"
        output, wall_s, rc = run_pytest(pytest_args, log)
        interpreters = interpreters_by_file(log, {os.getpid()})
    if args.raw:
        args.raw.write_text(output)
    body, _ = table(output, interpreters)
    summary = next(
        (m.group(0).strip("= ") for line in output.splitlines() if (m := SUMMARY_LINE.match(line))), "?"
    )
    load = os.getloadavg()
    header = (
        f"# {args.title}\n\n"
        f"`python scripts/suite_durations.py {' '.join(pytest_args)}`: pytest `{summary}`, "
        f"{wall_s / 60:.1f} min of wall time; exit code {rc}; load average at the end "
        f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} on {os.cpu_count()} cores. Seconds are each test's "
        "setup, call and teardown as pytest reports them (module fixtures count in their first test). "
        "Interpreters: Python processes started while the file's tests ran.\n\n"
    )
    args.out.write_text(header + body)
    print(header + body.split("\n\n")[0])
    if rc not in (0, 1):
        print(output[-5000:])
    return rc


if __name__ == "__main__":
    sys.exit(main())
