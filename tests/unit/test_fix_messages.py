"""Messages that name the fix, where the user's own code or files meet the library: each case a
user hit gives an error (or warning) that says what is wrong and what to do, pinned here by its
text; torch's advice to load with ``weights_only=False`` never reaches the user."""

from __future__ import annotations

import io
import os
import random
import shutil
import warnings
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from pytorch_accelerated import Trainer
from tests.helpers import make_regression_data, make_trainer, snapshot


def chain(error: BaseException | None) -> list[BaseException]:
    """``error`` and every exception chained to it, as causes or as context."""
    seen: list[BaseException] = []
    while error is not None and error not in seen:
        seen.append(error)
        error = error.__cause__ or error.__context__
    return seen


# ---------------------------------------------------------------------------- resume_from a file


def test_resume_from_a_checkpoint_file_says_it_is_not_a_training_state_and_how_to_load_it(
    tmp_path: Path,
) -> None:
    trainer = make_trainer()
    trainer.train(make_regression_data(8), num_epochs=1, per_device_batch_size=4)
    trainer.save_checkpoint(tmp_path / "ok.pt")
    resumed = make_trainer()
    with pytest.raises(NotADirectoryError) as error:
        resumed.train(
            make_regression_data(8), num_epochs=2, per_device_batch_size=4, resume_from=tmp_path / "ok.pt"
        )
    message = str(error.value)
    assert f"resume_from='{tmp_path / 'ok.pt'}' is a file, not a training state" in message
    assert "is a checkpoint file" in message and "no such directory" not in message
    assert f"call trainer.load_checkpoint('{tmp_path / 'ok.pt'}') before trainer.train(...)" in message
    assert "pass resume_from a state directory or a folder of them" in message
    assert resumed.progress.global_step == 0


# ---------------------------------------------------------------------------- weights_only


class RunsCode:
    def __reduce__(self) -> tuple[Any, ...]:
        return (os.getcwd, ())


def real_checkpoint(tmp_path: Path) -> bytes:
    trainer = make_trainer()
    trainer.train(make_regression_data(8), num_epochs=1, per_device_batch_size=4)
    trainer.save_checkpoint(tmp_path / "real.pt")
    return (tmp_path / "real.pt").read_bytes()


def zip_with_bad_member(real: bytes, member: str, content: bytes) -> bytes:
    """``real`` (a torch zip) with ``member`` (a name ending it) replaced by ``content``."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(real)) as source, zipfile.ZipFile(buffer, "w") as target:
        for info in source.infolist():
            data = content if info.filename.endswith(member) else source.read(info.filename)
            target.writestr(info, data)
    return buffer.getvalue()


def junk_inputs(real: bytes) -> list[tuple[str, bytes]]:
    generator = random.Random(18)
    cases = [(f"random-{n}", generator.randbytes(n)) for n in (1, 7, 64, 512, 4096) for _ in range(10)]
    cases += [
        (f"random-pickle-{n}", b"\x80\x02" + generator.randbytes(n)) for n in (8, 100, 1000) for _ in range(5)
    ]
    cases += [(f"truncated-{cut}", real[:cut]) for cut in range(1, len(real), max(1, len(real) // 50))]
    cases += [
        (f"bad-member-data.pkl-{n}", zip_with_bad_member(real, "data.pkl", generator.randbytes(n)))
        for n in (0, 5, 50, 500)
    ]
    cases += [
        (f"bad-member-storage-{n}", zip_with_bad_member(real, "data/0", generator.randbytes(n)))
        for n in (0, 3, 17)
    ]
    cases += [("bad-member-version", zip_with_bad_member(real, "version", b"junk"))]
    flipped = bytearray(real)
    for offset in range(0, len(flipped), max(1, len(flipped) // 25)):
        flipped[offset] ^= 0xFF
    cases += [("many-flips", bytes(flipped))]
    return cases


def test_no_junk_file_gives_torchs_weights_only_advice_in_the_error_or_its_chain_or_a_warning(
    tmp_path: Path,
) -> None:
    cases = junk_inputs(real_checkpoint(tmp_path))
    trainer = make_trainer()
    before = snapshot(trainer)
    leaks, refused = [], 0
    for index, (name, data) in enumerate(cases):
        path = tmp_path / f"{index}-{name}.pt"
        path.write_bytes(data)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                trainer.load_checkpoint(path)
            except Exception as error:
                refused += 1
                texts = [str(e) for e in chain(error)]
            else:
                texts = []
        texts += [str(w.message) for w in caught]
        if any("weights_only" in text for text in texts):
            leaks.append(name)
    assert leaks == [], f"{len(leaks)} of {len(cases)} leaked torch's weights_only advice: {leaks}"
    assert refused == len(cases) >= 125
    assert [k for k in snapshot(trainer)] == [k for k in before]


def test_a_hostile_rng_file_of_a_0_1_x_state_is_skipped_with_a_warning_without_weights_only_advice(
    tmp_path: Path,
) -> None:
    from tests.compat.test_compat_checkpoints import write_original_state

    write_original_state(tmp_path / "epoch_2", 2)
    torch.save({"payload": RunsCode()}, tmp_path / "epoch_2" / "random_states_0.pkl")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_trainer().load_training_state(tmp_path / "epoch_2")
    messages = [str(w.message) for w in caught]
    skipped = [m for m in messages if "the RNGs are not restored" in m]
    assert len(skipped) == 1 and "random_states_0.pkl safely" in skipped[0] and "getcwd" in skipped[0], (
        messages
    )
    assert not any("weights_only" in m for m in messages), messages


# ---------------------------------------------------------------------------- a DataLoader as data set


@pytest.mark.parametrize("entry", ["train", "train-eval", "evaluate", "predict"])
def test_a_dataloader_passed_as_the_data_set_is_refused_at_the_start_naming_the_fix(entry: str) -> None:
    data = make_regression_data(8)
    loader = DataLoader(data, batch_size=4)
    trainer = make_trainer()
    calls = {
        "train": lambda: trainer.train(loader, num_epochs=1),
        "train-eval": lambda: trainer.train(data, num_epochs=1, eval_dataset=loader),
        "evaluate": lambda: trainer.evaluate(loader),
        "predict": lambda: trainer.predict(loader),
    }
    name = {"train": "train_dataset", "train-eval": "eval_dataset"}.get(entry, "dataset")
    with pytest.raises(TypeError) as error:
        calls[entry]()
    assert str(error.value).startswith(f"{name} must be a data set (a torch Dataset), got a DataLoader")
    assert f"({name}=loader.dataset)" in str(error.value)
    assert "override create_train_dataloader / create_eval_dataloader" in str(error.value)
    assert trainer.progress.global_step == 0


# ---------------------------------------------------------------------------- frozen parameters


def test_every_parameter_frozen_after_the_optimizer_was_built_names_them_and_how_to_unfreeze() -> None:
    trainer = make_trainer()
    for parameter in trainer.model.parameters():
        parameter.requires_grad_(False)
    with pytest.raises(RuntimeError) as error:
        trainer.train(make_regression_data(8), num_epochs=1, per_device_batch_size=4)
    message = str(error.value)
    assert message.startswith(
        "No parameter of the model requires grad: all 2 parameter tensors (weight, bias)"
    )
    assert "parameter.requires_grad_(True), or ModelFreezer's unfreeze()" in message
    assert "element 0 of tensors does not require grad" in message  # torch's own words, kept


class DetachedLoss(Trainer):
    def calculate_train_batch_loss(self, batch: Any) -> dict[str, Any]:
        output = super().calculate_train_batch_loss(batch)
        return {**output, "loss": output["loss"].detach()}


def test_a_detached_loss_with_trainable_parameters_says_the_loss_was_cut_off() -> None:
    trainer = make_trainer(trainer_class=DetachedLoss)
    with pytest.raises(RuntimeError, match=r"the model has trainable parameters, but the loss was computed"):
        trainer.train(make_regression_data(8), num_epochs=1, per_device_batch_size=4)


# ---------------------------------------------------------------------------- loss and batch shapes


class LossWithExtras(nn.Module):
    def forward(self, outputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
        loss = nn.functional.mse_loss(outputs, targets)
        return loss, {"mse": loss.detach()}


def test_a_loss_function_returning_a_tuple_is_told_what_the_trainer_expects() -> None:
    trainer = make_trainer(loss_func=LossWithExtras())
    with pytest.raises(TypeError) as error:
        trainer.train(make_regression_data(8), num_epochs=1, per_device_batch_size=4)
    message = str(error.value)
    assert message.startswith(
        "calculate_train_batch_loss returned a loss that is a tuple of 2 (Tensor, dict): the loss "
        "function probably returns extra outputs"
    )
    assert "needs the loss as a scalar tensor: override calculate_train_batch_loss" in message
    assert "reduction='mean'" not in message


class DictData(torch.utils.data.Dataset):
    def __init__(self) -> None:
        self.data = make_regression_data(8)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        x, y = self.data[index]
        return {"input": x, "label": y}


@pytest.mark.parametrize("entry", ["train", "evaluate"])
def test_a_dict_batch_with_the_default_loss_says_how_it_is_unpacked_and_to_override(entry: str) -> None:
    trainer = make_trainer()
    with pytest.raises(TypeError) as error:
        if entry == "train":
            trainer.train(DictData(), num_epochs=1, per_device_batch_size=4)
        else:
            trainer.evaluate(DictData(), per_device_batch_size=4)
    method = f"calculate_{'train' if entry == 'train' else 'eval'}_batch_loss"
    message = str(error.value)
    assert message.startswith(
        f"The default {method} unpacks each batch as inputs, targets = batch[0], batch[1], but got a "
        f"dict batch with keys ['input', 'label']."
    )
    assert "override calculate_train_batch_loss and calculate_eval_batch_loss" in message
    assert "dict: 0" not in message


def test_no_junk_file_in_a_training_state_gives_torchs_weights_only_advice(tmp_path: Path) -> None:
    trainer = make_trainer()
    trainer.train(make_regression_data(8), num_epochs=1, per_device_batch_size=4)
    trainer.save_training_state(tmp_path / "good")
    generator = random.Random(5)
    files = sorted(path.name for path in (tmp_path / "good").iterdir() if path.suffix == ".pt")
    assert len(files) >= 3, files
    leaks, tried = [], 0
    for name in files:
        real = (tmp_path / "good" / name).read_bytes()
        for index, junk in enumerate(
            (generator.randbytes(300), real[: len(real) // 2], b"\x80\x02" + generator.randbytes(50))
        ):
            state = tmp_path / f"{name}-{index}"
            shutil.copytree(tmp_path / "good", state)
            (state / name).write_bytes(junk)
            tried += 1
            with warnings.catch_warnings(record=True) as caught, pytest.raises(Exception) as error:
                warnings.simplefilter("always")
                make_trainer().load_training_state(state)
            texts = [str(e) for e in chain(error.value)] + [str(w.message) for w in caught]
            if any("weights_only" in text for text in texts):
                leaks.append(f"{name}-{index}")
    assert leaks == [], f"{len(leaks)} of {tried}: {leaks}"
