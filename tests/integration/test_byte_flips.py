"""Every byte verified: a single byte flipped anywhere in a training state or a checkpoint file is
found before anything is loaded.

The campaign: for every file of a plain training state and of one saved in the background
(``asynchronous=True``), and for a ``save_checkpoint`` file and its ``.crc32``, single bytes are
flipped (XOR with a random non-zero value) at the first and last byte and at random offsets
(seeded). Each flip is tried on its own copy:

- named explicitly (``load_training_state`` and ``train(resume_from=<state>)``): an error naming the
  damaged file (or the manifest), and the model and optimizer unchanged;
- in a folder (``train(resume_from=<folder>)``): the previous state is resumed, with a warning that
  names the damaged state and file, and the run goes on from there.

Caught / tried is printed (``pytest -s``). The same for sharded states under FSDP:
tests/distributed/test_fsdp_states.py.
"""

from __future__ import annotations

import copy
import functools
import random
import re
import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from pytorch_accelerated import Trainer
from pytorch_accelerated.schedulers import CosineLrScheduler
from tests.helpers import assert_equal_nested, make_regression_data, snapshot
from tests.helpers import make_trainer as make_any_trainer

make_trainer = functools.partial(make_any_trainer, optimizer_class=torch.optim.Adam, lr=0.1)
RANDOM_OFFSETS = 5  # per file, besides its first and last byte
SCHEDULER = CosineLrScheduler.create_scheduler_fn()


def train(trainer: Trainer, **kwargs: Any) -> Trainer:
    trainer.train(
        make_regression_data(8),
        num_epochs=kwargs.pop("num_epochs", 1),
        per_device_batch_size=4,
        create_scheduler_fn=SCHEDULER,
        **kwargs,
    )
    return trainer


def flips(path: Path, seed: int) -> list[tuple[int, int]]:
    """(offset, XOR mask) of the flips to try in ``path``: its first and last byte, and random ones."""
    size = path.stat().st_size
    rng = random.Random(f"{seed}:{path.name}")
    offsets = [0, size - 1, *rng.sample(range(1, size - 1), min(RANDOM_OFFSETS, size - 2))]
    return [(offset, rng.randrange(1, 256)) for offset in offsets]


def flip(path: Path, offset: int, mask: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= mask
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module", params=["synchronous", "asynchronous"])
def states(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with two good states, after 2 updates (step-2) and after 4 (step-4), saved as the
    parameter says; every file of step-4 is flipped."""
    folder = tmp_path_factory.mktemp(f"states_{request.param}")
    background = request.param == "asynchronous"
    trainer = train(make_trainer())
    trainer.save_training_state(folder / "step-2", asynchronous=background)
    trainer.wait_for_training_state()
    resumed = train(make_trainer(), num_epochs=2, resume_from=folder / "step-2")
    resumed.save_training_state(folder / "step-4", asynchronous=background)
    resumed.wait_for_training_state()
    return folder


def weights_and_moments(trainer: Trainer) -> dict[str, Any]:
    """What a state would replace: the weights and the optimizer's state (a new scheduler sets the
    learning rate in ``train`` before the state is read)."""
    return copy.deepcopy(
        {"model": trainer.get_model().state_dict(), "optimizer": trainer.optimizer.state_dict()["state"]}
    )


def resume_from(resume: Any, state: Path) -> None:
    resume(resume_from=state)


def state_files(state: Path) -> list[str]:
    return sorted(path.name for path in state.iterdir())


def test_every_single_byte_flip_in_a_named_state_is_an_error_naming_the_file(
    tmp_path: Path, states: Path
) -> None:
    names = state_files(states / "step-4")
    assert names == [
        "manifest.json",
        "model.pt",
        "optimizer.pt",
        "rng_state_0.pt",
        "scheduler.pt",
        "trainer_state.pt",
    ]
    tried = caught = 0
    for name in names:
        for index, (offset, mask) in enumerate(flips(states / "step-4" / name, seed=0)):
            state = shutil.copytree(states / "step-4", tmp_path / f"{name}-{index}")
            flip(state / name, offset, mask)
            trainer = train(make_trainer(seed=1))
            before = weights_and_moments(trainer)
            tried += 2
            resume = functools.partial(train, trainer, num_epochs=3)
            for load in (trainer.load_training_state, functools.partial(resume_from, resume)):
                with pytest.raises((ValueError, OSError)) as error:
                    load(state)
                where = f"{name} at byte {offset} of {(state / name).stat().st_size} (mask {mask:#x})"
                assert f"{state / name} is damaged" in str(error.value), where
                assert "Resume from another state" in str(error.value), where
                assert_equal_nested(weights_and_moments(trainer), before, where)
                caught += 1
    print(f"\nnamed state ({states.name}): single-byte flips caught {caught} / tried {tried}")
    assert caught == tried == 2 * len(names) * (RANDOM_OFFSETS + 2)


def test_every_single_byte_flip_in_the_newest_state_of_a_folder_falls_back_with_a_warning(
    tmp_path: Path, states: Path
) -> None:
    tried = caught = 0
    expected = train(make_trainer(seed=1), num_epochs=2, resume_from=states / "step-2")
    for name in state_files(states / "step-4"):
        for index, (offset, mask) in enumerate(flips(states / "step-4" / name, seed=1)):
            folder = shutil.copytree(states, tmp_path / f"{name}-{index}")
            flip(folder / "step-4" / name, offset, mask)
            tried += 1
            with warnings.catch_warnings(record=True) as caught_warnings:
                warnings.simplefilter("always")
                trainer = train(make_trainer(seed=1), num_epochs=2, resume_from=folder)
            skipped = [
                str(warning.message)
                for warning in caught_warnings
                if str(warning.message).startswith(f"Skipped the training state {folder / 'step-4'}:")
            ]
            where = f"{name} at byte {offset} (mask {mask:#x})"
            assert len(skipped) == 1, where
            assert f"{folder / 'step-4' / name} is damaged" in skipped[0], where
            assert re.search(f"Resuming from {re.escape(str(folder / 'step-2'))} instead", skipped[0]), where
            assert trainer.progress.global_step == 4, where  # 2 restored, then 1 more epoch of 2
            assert_equal_nested(snapshot(trainer), snapshot(expected), where)
            caught += 1
    print(f"\nfolder ({states.name}): single-byte flips caught {caught} / tried {tried}")
    assert caught == tried


def test_every_single_byte_flip_in_a_checkpoint_file_or_its_checksum_is_an_error(tmp_path: Path) -> None:
    train(make_trainer()).save_checkpoint(tmp_path / "good" / "ckpt.pt")
    assert state_files(tmp_path / "good") == ["ckpt.pt", "ckpt.pt.crc32"]
    tried = caught = 0
    for name in ("ckpt.pt", "ckpt.pt.crc32"):
        for index, (offset, mask) in enumerate(flips(tmp_path / "good" / name, seed=2)):
            folder = shutil.copytree(tmp_path / "good", tmp_path / f"{name}-{index}")
            flip(folder / name, offset, mask)
            trainer = make_trainer(seed=1)
            before = snapshot(trainer)
            tried += 1
            with pytest.raises(ValueError) as error:
                trainer.load_checkpoint(folder / "ckpt.pt")
            where = f"{name} at byte {offset} (mask {mask:#x})"
            assert f"{folder / 'ckpt.pt'} is damaged" in str(error.value), where
            assert f"{folder / 'ckpt.pt.crc32'} records" in str(error.value), where
            assert "Load another checkpoint with load_checkpoint" in str(error.value), where
            assert_equal_nested(snapshot(trainer), before, where)
            caught += 1
    print(f"\ncheckpoint file: single-byte flips caught {caught} / tried {tried}")
    assert caught == tried


WITHOUT_CHECKSUM_OFFSETS = 60  # random offsets, besides the first and last byte


def test_no_single_byte_flip_in_a_checkpoint_without_its_checksum_file_loads_silently(tmp_path: Path) -> None:
    """A copy without its .crc32 cannot be verified: each flip is refused by torch's own checks, or
    loads with the warning that the file was not verified; none loads without a word."""
    train(make_trainer()).save_checkpoint(tmp_path / "good" / "ckpt.pt")
    (tmp_path / "good" / "ckpt.pt.crc32").unlink()
    size = (tmp_path / "good" / "ckpt.pt").stat().st_size
    rng = random.Random(3)
    offsets = [0, size - 1, *rng.sample(range(1, size - 1), WITHOUT_CHECKSUM_OFFSETS)]
    silent, refused, warned = [], 0, 0
    for index, offset in enumerate(offsets):
        folder = shutil.copytree(tmp_path / "good", tmp_path / f"flip-{index}")
        flip(folder / "ckpt.pt", offset, rng.randrange(1, 256))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                make_trainer(seed=1).load_checkpoint(folder / "ckpt.pt")
            except Exception:  # any error: refused (torch's zip checks, the model's keys and shapes)
                refused += 1
                continue
        if any("without checking its bytes" in str(warning.message) for warning in caught):
            warned += 1
        else:
            silent.append(offset)
    print(
        f"\ncheckpoint without .crc32: of {len(offsets)} single-byte flips, {refused} refused, {warned} loaded "
        f"with the warning, {len(silent)} loaded silently"
    )
    assert silent == []
