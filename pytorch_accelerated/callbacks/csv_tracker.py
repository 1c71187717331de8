"""CSVTracker: a tracker with no dependencies, one CSV row per logged value."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import Any

from accelerate.tracking import GeneralTracker

__all__ = ["CSVTracker"]


class CSVTracker(GeneralTracker):
    """A tracker with no dependencies: one row ``step,name,value`` per logged value in
    ``<logging_dir>/<run_name>/metrics.csv``, hyperparameters in ``hparams.json`` next to it.

    ``resume_step``: continue a run resumed at that many updates; rows of that step and later
    ones (logged by the interrupted run) are removed first, and the resumed run logs them again.
    """

    name = "csv"
    requires_logging_directory = True
    main_process_only = True

    def __init__(
        self, run_name: str, logging_dir: str | os.PathLike = "runs", resume_step: int | None = None
    ) -> None:
        super().__init__()
        self.directory = Path(logging_dir) / run_name
        self.path = self.directory / "metrics.csv"
        self.resume_step = resume_step
        self._file: Any = None
        self._writer: Any = None  # one csv.writer on the open file, kept for the run

    @property
    def tracker(self) -> Any:
        return self._file

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        if self.resume_step is not None and self.path.exists():
            self._keep_rows_before(self.resume_step)
        new = not self.path.exists() or self.path.stat().st_size == 0
        self._file = open(self.path, "a", newline="")  # noqa: SIM115 (closed by finish)
        self._writer = csv.writer(self._file)
        if new:
            self._writer.writerow(["step", "name", "value"])
            self._file.flush()

    def _keep_rows_before(self, step: int) -> None:
        with open(self.path, newline="") as file:
            rows = list(csv.reader(file))
        kept = rows[:1] + [row for row in rows[1:] if len(row) == 3 and int(row[0]) < step]
        partial = self.path.with_suffix(".csv.tmp")
        with open(partial, "w", newline="") as file:
            csv.writer(file).writerows(kept)
            file.flush()
            os.fsync(file.fileno())
        os.replace(partial, self.path)

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        partial = self.directory / "hparams.json.tmp"
        partial.write_text(json.dumps(values, indent=2, sort_keys=True, default=str))
        os.replace(partial, self.directory / "hparams.json")

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Append one row per value, all in one write, then flush once: a reader of the file
        sees whole points (``flush()``, before a training state is published, also syncs)."""
        self._writer.writerows([(step, name, repr(float(value))) for name, value in values.items()])
        self._file.flush()

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()
            os.fsync(self._file.fileno())

    def finish(self) -> None:
        if self._file is not None:
            self.flush()
            self._file.close()
            self._file = self._writer = None
