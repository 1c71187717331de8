"""Signals honoured everywhere: a real SIGTERM (or SIGINT) sent to a training script at each kind
of moment stops the run at the next safe point, saves, says so, and the script exits 0.

One worker process (tests/integration/workers/signal_worker.py) runs every scenario in turn; at each scenario's
moment it writes a ready file and waits, and the test sends the signal then (no sleeps). The
2-process cases (a dead peer, collectives that not every process reaches) are in
tests/distributed/test_hangs.py.
"""

from __future__ import annotations

import json
import signal
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from tests import forked
from tests.helpers import (
    subprocess_env,
)
from tests.integration.workers import signal_worker as sw

WORKER = Path(sw.__file__).resolve()
TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Start the worker with every scenario, send each signal when its ready file appears."""
    out = tmp_path_factory.mktemp("signals")
    log_path = out / "worker.log"
    process = forked.start(
        WORKER, ["--out", str(out), *sw.SCENARIOS], env=subprocess_env(out), cwd=out, log=log_path
    )
    deadline = time.monotonic() + TIMEOUT_S
    try:
        for name, (signum, *_) in sw.SCENARIOS.items():
            ready = out / f"{name}.ready"
            while not ready.exists():
                assert process.poll() is None, f"the worker exited before {name}:\n{log_path.read_text()}"
                assert time.monotonic() < deadline, (
                    f"the worker never reached {name}:\n{log_path.read_text()}"
                )
                time.sleep(0.02)
            process.send_signal(signum)
        returncode = process.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if process.poll() is None:
            process.kill()
    output = log_path.read_text()
    assert returncode == 0, output  # train() returned normally every time
    results = json.loads((out / "results.json").read_text())
    results["out"] = str(out)
    results["output"] = {name: output.split(f"=== {name}\n")[1].split("=== ")[0] for name in sw.SCENARIOS}
    return results


def stop_lines(runs: dict[str, Any], name: str) -> list[str]:
    return [line for line in runs["output"][name].splitlines() if "SIGTERM" in line or "SIGINT" in line]


def assert_stopped(
    runs: dict[str, Any], name: str, signal_name: str, step: int, state: str | None = None
) -> None:
    """Stopped after ``step`` updates, saved there (``state``, default ``step_{step}``), said so
    in one line, let go of the signal."""
    run = runs[name]
    state_dir = Path(runs["out"]) / name / "states" / (state or f"step_{step}")
    assert run["global_step"] == step
    assert run["states"] == [state_dir.name]
    assert stop_lines(runs, name) == [
        f"Training stopped: received {signal_name}; saved the training state to {state_dir}"
    ]
    assert run["handlers_restored"] and run["wakeup_fd"] == -1


def assert_resumes_exactly(runs: dict[str, Any], name: str) -> None:
    reference, resumed = runs["reference"], runs[name]["resumed"]
    assert resumed["weights"] == reference["weights"]  # bitwise: the floats went through JSON
    assert resumed["history"] == reference["history"]
    assert resumed["global_step"] == reference["global_step"] == 8


def test_sigterm_during_training_stops_after_that_update_and_saves(runs: dict[str, Any]) -> None:
    assert_stopped(runs, "training", "SIGTERM", step=3)
    assert runs["training"]["history"] == {}  # the first epoch never finished
    assert_resumes_exactly(runs, "training")


def test_sigint_when_named_is_honoured_like_sigterm(runs: dict[str, Any]) -> None:
    assert_stopped(runs, "sigint", "SIGINT", step=6)
    assert "KeyboardInterrupt" not in runs["output"]["sigint"]
    assert_resumes_exactly(runs, "sigint")


def test_sigterm_during_the_last_evaluation_stops_at_the_next_batch_and_records_no_partial_loss(
    runs: dict[str, Any],
) -> None:
    assert_stopped(runs, "last_evaluation", "SIGTERM", step=8)
    # The second evaluation stopped after its first batch: its loss is not recorded.
    assert len(runs["last_evaluation"]["history"]["eval_loss_epoch"]) == 1
    assert_resumes_exactly(runs, "last_evaluation")  # the evaluation runs again, in full


def test_sigterm_during_an_intermediate_evaluation_stops_there(runs: dict[str, Any]) -> None:
    assert_stopped(runs, "intermediate_evaluation", "SIGTERM", step=2)
    assert_resumes_exactly(runs, "intermediate_evaluation")


def test_sigterm_during_the_epoch_end_events_stops_at_the_epoch_end(runs: dict[str, Any]) -> None:
    assert_stopped(runs, "epoch_end", "SIGTERM", step=4, state="epoch_1")
    assert len(runs["epoch_end"]["history"]["eval_loss_epoch"]) == 1  # the first epoch is complete
    assert_resumes_exactly(runs, "epoch_end")


@pytest.mark.parametrize("name", ["after_last_step", "during_end_save"])
def test_a_signal_after_the_last_step_is_honoured_by_the_state_saved_at_the_end(
    runs: dict[str, Any], name: str
) -> None:
    run = runs[name]
    assert run["states"] == ["final"] and run["global_step"] == 8
    assert run["weights"] == runs["reference"]["weights"]
    state_dir = Path(runs["out"]) / name / "states" / "final"
    assert stop_lines(runs, name) == [
        f"Received SIGTERM after the last step: the training state saved to {state_dir} covers it."
    ]
    assert run["handlers_restored"] and run["wakeup_fd"] == -1


@pytest.mark.parametrize("value", ["soon", "0", "-5", "nan"])
def test_a_bad_collective_timeout_in_the_environment_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    import torch
    from torch import nn

    from pytorch_accelerated import Trainer

    monkeypatch.setenv("PT_ACC_COLLECTIVE_TIMEOUT", value)
    model = nn.Linear(3, 1)
    with pytest.raises(ValueError) as raised:
        Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.1), callbacks=())
    assert str(raised.value) == (
        f"The environment variable PT_ACC_COLLECTIVE_TIMEOUT={value!r} must be a positive number of "
        f"seconds, e.g. PT_ACC_COLLECTIVE_TIMEOUT=300; unset it for the default (300 s)."
    )


SIGTERM_AFTER_FAILURE = textwrap.dedent(
    """
    import os, signal, sys, time
    import torch
    from torch import nn
    from torch.utils.data import TensorDataset
    from pytorch_accelerated import Trainer
    from pytorch_accelerated.callbacks import SaveTrainingStateCallback, TrainerCallback

    class Fails(TrainerCallback):
        def on_train_epoch_end(self, trainer, **kwargs):
            raise RuntimeError("a callback failed")

    model = nn.Linear(3, 1)
    trainer = Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.1),
                      callbacks=(SaveTrainingStateCallback(sys.argv[1]), Fails()))
    try:
        trainer.train(TensorDataset(torch.randn(8, 3), torch.randn(8, 1)), num_epochs=1)
    except RuntimeError:
        print("train() raised", flush=True)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(10)
    print("SIGTERM was ignored", flush=True)
    """
)


def test_sigterm_after_a_failed_run_terminates_the_process(tmp_path: Path) -> None:
    # The reported defect: the callback's SIGTERM handler stayed installed after the failure,
    # so the process went on ignoring SIGTERM.
    script = tmp_path / "script.py"
    script.write_text(SIGTERM_AFTER_FAILURE)
    result = forked.run(
        script, [str(tmp_path / "states")], env=subprocess_env(tmp_path), cwd=tmp_path, timeout=120
    )
    assert "train() raised" in result.stdout, result.stderr
    assert "SIGTERM was ignored" not in result.stdout
    assert result.returncode == -signal.SIGTERM
