"""What a run prints: progress bars on a terminal, one summary line per epoch elsewhere, metrics
at one precision, and lines printed by callbacks above the bars.

The runs are tests/integration/workers/progress_worker.py in a subprocess, its standard output a pipe (as in a log
file), a pseudo-terminal (as in a shell), or a pipe from a 2-process ``torchrun`` group; the
bars' choices of on and off are also checked in process, on a stream that says it is a terminal.
"""

from __future__ import annotations

import fcntl
import io
import os
import pty
import re
import select
import struct
import sys
import termios
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import (
    LogMetricsCallback,
    ProgressBarCallback,
    StopTrainingError,
    TrainerCallback,
)
from pytorch_accelerated.callbacks.defaults import format_metric_value
from tests import forked
from tests.helpers import (
    make_linear_model,
    make_regression_data,
    subprocess_env,
)
from tests.integration.workers.progress_worker import CALLBACK_LINE

WORKER = str(Path(__file__).parent / "workers" / "progress_worker.py")
METRIC_LINE = re.compile(r"^(train_loss_epoch|eval_loss_epoch|accuracy): (\S+)$")


def worker_env(tmp_path: Path) -> dict[str, str]:
    env = subprocess_env(tmp_path)
    env.pop("TQDM_DISABLE", None)
    return env


def summary_line(epoch: int, step: int) -> str:
    return rf"^epoch {epoch}/2: 11/11 batches, step {step}, loss (\S+), lr 0\.01, \d+ samples/s, [\d.]+ s$"


def assert_one_precision(lines: list[str]) -> None:
    """Every metric value printed, and the summaries' losses, read as ``.6g`` of themselves."""
    values = [m.group(2) for m in map(METRIC_LINE.match, lines) if m]
    values += [m.group(1) for line in lines for m in [re.search(r", loss (\S+),", line)] if m]
    assert len(values) >= 8 and all(value == f"{float(value):.6g}" for value in values), values


def run_under_pty(script: str, env: dict[str, str], cwd: Path, timeout_s: float = 60.0) -> str:
    """Run ``script`` (forked: :mod:`tests.forked`) with a 200-column pseudo-terminal as its stdin,
    stdout and stderr."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
    process = forked.start(script, env=env, cwd=cwd, terminal=os.ttyname(follower))
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    try:  # (this end of the terminal stays open until the process has ended: it opens the device by name)
        while time.monotonic() < deadline:
            if select.select([leader], [], [], 0.2)[0]:
                chunks.append(os.read(leader, 65536))
            elif process.poll() is not None:  # ended, and everything it wrote was read
                break
        else:
            process.kill()
            pytest.fail(
                f"The run under a terminal did not finish in {timeout_s} s:\n{b''.join(chunks).decode()}"
            )
    finally:
        os.close(follower)
        os.close(leader)
        process.wait(timeout=30)
    output = b"".join(chunks).decode()
    assert process.returncode == 0, output
    return output


def render(output: str) -> list[str]:
    """The lines a terminal shows after ``output``: ``\\r`` returns to the line's start and
    later text overwrites, ``\\n`` goes down a line, ``ESC[nA`` goes up n lines."""
    screen: list[list[str]] = [[]]
    row = column = 0
    for token in re.findall(r"\x1b\[(\d*)([A-Za-z])|(.)", output, flags=re.DOTALL):
        count, command, char = token
        if command == "A":
            row = max(0, row - int(count or 1))
        elif command:
            continue  # other escapes (colours, erase) do not move text
        elif char == "\r":
            column = 0
        elif char == "\n":
            row += 1
            screen.extend([] for _ in range(row + 1 - len(screen)))
        else:
            line = screen[row]
            line.extend(" " * (column + 1 - len(line)))
            line[column] = char
            column += 1
    return ["".join(line).rstrip() for line in screen]


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (0.1979999989271164, "0.198"),
        (torch.tensor(0.198), "0.198"),
        (torch.tensor([0.198], dtype=torch.float64), "0.198"),
        (np.float32(0.198), "0.198"),
        (np.array([2.274051]), "2.27405"),
        (2.274051, "2.27405"),
        (1e-7, "1e-07"),
        (7, "7"),
        (torch.tensor(7), "7"),
        (np.int64(7), "7"),
        (float("nan"), "nan"),
        (torch.tensor(float("-inf")), "-inf"),
        (True, "True"),
        ("n/a", "n/a"),
        (None, "None"),
    ],
)
def test_format_metric_value_shows_every_type_at_one_precision(value: Any, shown: str) -> None:
    assert format_metric_value(value) == shown


def test_piped_output_has_no_bar_one_summary_line_per_epoch_and_one_precision(tmp_path: Path) -> None:
    done = forked.run(WORKER, env=worker_env(tmp_path), cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "\r" not in done.stdout + done.stderr
    lines = done.stdout.splitlines()
    summaries = [line for line in lines if line.startswith("epoch ")]
    assert len(summaries) == 2, done.stdout
    assert re.match(summary_line(1, 11), summaries[0]) and re.match(summary_line(2, 22), summaries[1]), (
        summaries
    )
    assert lines.count("accuracy: 0.198") == 2, done.stdout  # a tensor metric prints like a float
    assert_one_precision(lines)
    assert lines.count(CALLBACK_LINE) == 1


def test_terminal_shows_bars_with_true_final_states_and_prints_above_them(tmp_path: Path) -> None:
    output = run_under_pty(WORKER, worker_env(tmp_path), tmp_path)
    screen = render(output)
    for epoch in (1, 2):  # each epoch's bar stays on the screen in its final state
        final = rf"^epoch {epoch}/2: 100%\|.*\| 11/11 \[.*, step={11 * epoch}, loss=\S+, lr=0\.01, samples/s=\d+\]$"
        assert sum(bool(re.match(final, line)) for line in screen) == 1, "\n".join(screen)
    assert CALLBACK_LINE in screen, "\n".join(screen)  # a line of its own, not after bar text
    assert not any(re.match(r"^epoch \d/2: 11/11 batches", line) for line in screen)  # no summary lines
    assert screen.count("accuracy: 0.198") == 2 and "FINISHED rank 0" in screen


@pytest.mark.distributed  # 2 processes: not in the quick tier
def test_two_processes_print_one_set_of_progress_lines_with_true_final_states(tmp_path: Path) -> None:
    done = forked.run(
        WORKER, ["--samples", "88"], nproc=2, env=worker_env(tmp_path), cwd=tmp_path, timeout=120
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0 and "FINISHED rank 0" in output and "FINISHED rank 1" in output, output
    lines = done.stdout.splitlines()
    summaries = [line for line in lines if line.startswith("epoch ")]
    assert len(summaries) == 2, output  # from one process of the machine, not from each
    assert re.match(summary_line(1, 11), summaries[0]) and re.match(summary_line(2, 22), summaries[1]), (
        summaries
    )
    assert lines.count("Starting epoch 1") == 1 and lines.count("accuracy: 0.198") == 2, output
    assert "\r" not in output
    assert_one_precision(lines)


class TerminalStream(io.StringIO):
    """Collects what is written, and says it is a terminal, as a shell's stdout does."""

    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    ("is_terminal", "tqdm_disable", "enabled", "bar_expected"),
    [
        (True, None, None, True),
        (True, "1", None, False),  # tqdm's own switch
        (True, "0", None, True),
        (True, None, False, False),
        (False, None, None, False),
        (False, None, True, True),  # forced on: a bar even in a log file
        (False, "1", True, True),
    ],
)
def test_the_bar_is_on_by_terminal_unless_forced_or_tqdm_disable_is_set(
    monkeypatch: pytest.MonkeyPatch,
    is_terminal: bool,
    tqdm_disable: str | None,
    enabled: bool | None,
    bar_expected: bool,
) -> None:
    stream = TerminalStream() if is_terminal else io.StringIO()
    monkeypatch.setattr(sys, "stdout", stream)
    if tqdm_disable is None:
        monkeypatch.delenv("TQDM_DISABLE", raising=False)
    else:
        monkeypatch.setenv("TQDM_DISABLE", tqdm_disable)
    model = make_linear_model()
    callbacks = (ProgressBarCallback(enabled=enabled), LogMetricsCallback())
    trainer = Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.1), callbacks=callbacks)
    trainer.train(make_regression_data(8), num_epochs=1, per_device_batch_size=4)
    output = stream.getvalue()
    assert ("\r" in output) is bar_expected and ("| 2/2 [" in output) is bar_expected, output
    summary = r"^epoch 1/1: 2/2 batches, step 2, loss \S+, lr 0\.1, \d+ samples/s, [\d.]+ s$"
    assert bool(re.search(summary, output, flags=re.MULTILINE)) is not bar_expected, output


def test_progress_bar_arguments_are_checked() -> None:
    with pytest.raises(
        TypeError, match=r"ProgressBarCallback: enabled must be True, False or None .* got 'yes'"
    ):
        ProgressBarCallback(enabled="yes")  # type: ignore[arg-type]
    with pytest.raises(
        ValueError, match=r"ProgressBarCallback: refresh_interval must be a number of seconds > 0 .* got 0"
    ):
        ProgressBarCallback(refresh_interval=0)


def test_a_run_stopped_mid_epoch_prints_where_it_stopped(capsys: pytest.CaptureFixture[str]) -> None:
    class StopAtStep3(TrainerCallback):
        def on_train_step_end(self, trainer: Any, **kwargs: Any) -> None:
            if trainer.progress.global_step == 3:
                raise StopTrainingError("enough")

    model = make_linear_model()
    callbacks = (ProgressBarCallback(), StopAtStep3())
    trainer = Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.1), callbacks=callbacks)
    trainer.train(make_regression_data(20), num_epochs=2, per_device_batch_size=4)
    summaries = [line for line in capsys.readouterr().out.splitlines() if line.startswith("epoch ")]
    assert len(summaries) == 1 and summaries[0].startswith("epoch 1/2: 3/5 batches, step 3, loss "), summaries


def test_trainer_print_takes_the_arguments_of_print() -> None:
    model = make_linear_model()
    trainer = Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.1))
    stream = io.StringIO()
    trainer.print("a", 1, sep="-", end="!\n", file=stream)
    trainer.print("b", file=stream, flush=True)
    assert stream.getvalue() == "a-1!\nb\n"
