"""A real PostgreSQL server for a test, started in a temporary folder on a free port of 127.0.0.1 and
stopped (its folder removed) at the end: :func:`postgres_server`.

It uses the machine's PostgreSQL (``initdb`` and ``pg_ctl``, on PATH or in
``/usr/lib/postgresql/<version>/bin``; scripts/test.sh installs PostgreSQL where it is missing).
``initdb`` refuses to run as root, so under root the server runs as the ``postgres`` user (with
``runuser``), in a folder that user owns. The server trusts local connections: the URL has no
password. When it cannot start, the error says why and holds the server's log.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tests.helpers import free_port

SERVICE_USER = "postgres"
TIMEOUT_S = 60


class PostgresUnavailable(RuntimeError):
    """PostgreSQL is not installed here, or its server could not start (the message says which)."""


def server_binaries() -> Path:
    """The folder of ``initdb`` and ``pg_ctl``: PATH's, else the newest /usr/lib/postgresql/<v>/bin."""
    found = shutil.which("initdb")
    if found is not None and shutil.which("pg_ctl", path=str(Path(found).parent)):
        return Path(found).parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    if versions:
        return Path(versions[-1]).parent
    raise PostgresUnavailable(
        "PostgreSQL's initdb and pg_ctl were not found (on PATH or in /usr/lib/postgresql/<version>/bin), "
        "so the test cannot start a PostgreSQL server. Install the server (Debian: apt-get install "
        "postgresql; scripts/test.sh does this when it runs as root) and run the test again."
    )


def _as_service_user(command: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return command
    if shutil.which("runuser") is None:
        raise PostgresUnavailable(
            "running as root, PostgreSQL's server must run as another user, but runuser is missing"
        )
    return ["runuser", "-u", SERVICE_USER, "--", *command]


def _run(command: list[str], log: Path) -> None:
    result = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S)
    if result.returncode != 0:
        server_log = log.read_text(errors="replace") if log.exists() else "(no server log)"
        raise PostgresUnavailable(
            f"PostgreSQL could not start: {' '.join(command)} exited with {result.returncode}:\n"
            f"{result.stdout}{result.stderr}\n----- server log -----\n{server_log}"
        )


@contextlib.contextmanager
def postgres_server() -> Iterator[str]:
    """A running server for the ``with`` block: yields its SQLAlchemy URL (database ``postgres``)."""
    binaries = server_binaries()
    # Outside pytest's temporary folders, which only root may enter: the service user must reach it.
    folder = Path(tempfile.mkdtemp(prefix="pt-acc-postgres-", dir="/tmp"))
    data, log, port = folder / "data", folder / "server.log", free_port()
    if os.geteuid() == 0:
        shutil.chown(folder, SERVICE_USER, SERVICE_USER)
    started = False
    try:
        _run(
            _as_service_user([str(binaries / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust"]),
            log,
        )
        options = f"-p {port} -k {folder} -c listen_addresses=127.0.0.1"
        pg_ctl = [str(binaries / "pg_ctl"), "-D", str(data), "-l", str(log)]
        _run(_as_service_user([*pg_ctl, "-o", options, "-w", "-t", str(TIMEOUT_S), "start"]), log)
        started = True
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    finally:
        if started:
            subprocess.run(
                _as_service_user([*pg_ctl, "-m", "fast", "-w", "stop"]),
                capture_output=True,
                timeout=TIMEOUT_S,
            )
        shutil.rmtree(folder, ignore_errors=True)
