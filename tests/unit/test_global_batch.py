"""The global batch that ``resume_from="auto"`` keeps when the number of processes changes
(elastic membership): the rule, and a real state's manifest read before training. The real
2 -> 1 -> 2 process job is tests/distributed/test_elastic_membership.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytorch_accelerated.callbacks import SaveTrainingStateCallback
from pytorch_accelerated.checkpoints.directories import SEAL, write_manifest
from pytorch_accelerated.checkpoints.reshard import BatchSettings, kept_accumulation
from pytorch_accelerated.checkpoints.resume import ResumePlan
from tests.helpers import make_regression_data, make_trainer

STATE = Path("states/step_4")


@pytest.mark.parametrize(
    "saved, asked_then, now, kept",
    [
        ((2, 8, 1), 1, (1, 8, 1), 2),  # a machine left: 16 samples per update kept by accumulating 2
        ((1, 8, 2), 1, (2, 8, 1), 1),  # it came back: the script's own accumulation again
        ((2, 8, 2), 2, (4, 8, 2), 1),  # 32 samples: 4 x 8 x 1
        ((4, 4, 1), 1, (1, 4, 1), 4),
        ((2, 8, 1), None, (1, 8, 1), 2),  # a state from before the asked accumulation was recorded
        ((2, 8, 1), 1, (2, 8, 1), None),  # the same processes: the script's settings apply
        ((2, 8, 1), 1, (1, 4, 1), None),  # another per-device batch: the user chose a new one
        ((2, 8, 1), 1, (1, 8, 4), None),  # another accumulation asked: likewise
        ((1, 8, 2), 2, (2, 8, 1), None),  # the script asked 2 then and 1 now: its own choice
        ((0, 0, 0), None, (2, 8, 1), None),  # saved outside a training run
    ],
)
def test_the_kept_accumulation_keeps_the_saved_global_batch_when_only_the_processes_changed(
    saved: tuple[int, int, int], asked_then: int | None, now: tuple[int, int, int], kept: int | None
) -> None:
    assert kept_accumulation(BatchSettings(*saved), asked_then, BatchSettings(*now), STATE) == kept


def test_a_global_batch_the_new_processes_do_not_divide_is_refused_naming_the_numbers_and_the_fixes() -> None:
    with pytest.raises(ValueError) as error:
        kept_accumulation(BatchSettings(2, 8, 1), 1, BatchSettings(3, 8, 1), STATE)
    assert str(error.value) == (
        "Cannot resume states/step_4 on 3 process(es) with the same global batch: it was saved with 2 "
        "process(es) x per_device_batch_size 8 x gradient_accumulation_steps 1 (16 samples per update), and "
        "16 is not a multiple of 3 x per_device_batch_size 8 = 24, so no gradient_accumulation_steps keeps "
        "it. Launch on 1 or 2 process(es), or choose the new global batch yourself: pass another "
        "per_device_batch_size or gradient_accumulation_steps to train(), or name the state "
        "(resume_from='states/step_4'), which keeps the settings train() is given."
    )


def saved_state(tmp_path: Path, num_processes: int, updates: int = 2) -> Path:
    """Real states saved every 2 updates by one process (per-device batch 4, accumulation asked 1);
    the manifest of ``step_2`` then says it was written by ``num_processes`` (as one of them would have)."""
    saver = SaveTrainingStateCallback(tmp_path / "states", save_every_n_steps=2, save_at_end=False)
    trainer = make_trainer(callbacks=(saver,))
    trainer.train(
        make_regression_data(32), num_epochs=1, per_device_batch_size=4, max_num_train_steps=updates
    )
    state = tmp_path / "states" / "step_2"
    manifest = json.loads((state / "manifest.json").read_text())
    assert (manifest["num_processes"], manifest["asked_accumulation_steps"]) == (1, 1)
    manifest["num_processes"] = num_processes
    write_manifest(state, {key: value for key, value in manifest.items() if key not in (SEAL, "crc32")})
    return state


def test_the_newest_state_of_a_folder_decides_and_one_line_says_what_changed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = saved_state(tmp_path, num_processes=2)
    accelerator = make_trainer().accelerator  # one process
    assert ResumePlan.of(tmp_path / "states").accumulation_keeping_global_batch(accelerator, 4, 1) == 2
    assert capsys.readouterr().out == (
        f"Resuming {state} on 1 process(es), saved on 2: gradient_accumulation_steps 2 instead of 1 keeps "
        f"its global batch of 8 samples per update.\n"
    )
    assert (
        ResumePlan.of(tmp_path / "states").accumulation_keeping_global_batch(accelerator, 2, 1) == 1
    )  # a new batch size
    assert (
        ResumePlan.of(tmp_path / "empty").accumulation_keeping_global_batch(accelerator, 4, 3) == 3
    )  # nothing to resume
    assert capsys.readouterr().out == ""


def test_a_state_saved_on_these_processes_keeps_the_scripts_settings(tmp_path: Path) -> None:
    saved_state(tmp_path, num_processes=1)
    assert (
        ResumePlan.of(tmp_path / "states").accumulation_keeping_global_batch(make_trainer().accelerator, 4, 1)
        == 1
    )


def test_a_newest_state_whose_manifest_is_damaged_is_passed_over_as_the_resume_does(tmp_path: Path) -> None:
    state = saved_state(tmp_path, num_processes=2, updates=4)
    damaged = tmp_path / "states" / "step_4" / "manifest.json"
    damaged.write_text(damaged.read_text()[:40])  # cut short, as by a full disk
    assert (
        ResumePlan.of(tmp_path / "states").accumulation_keeping_global_batch(make_trainer().accelerator, 4, 1)
        == 2
    )
    assert state.name == "step_2"
