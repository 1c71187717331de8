"""Checksums: where they are written, what they cover, and what loads without one. (Single bytes
flipped in every file: tests/integration/test_byte_flips.py.)"""

from __future__ import annotations

import functools
import json
import warnings
import zlib
from pathlib import Path

import pytest
import torch

from pytorch_accelerated import Trainer
from pytorch_accelerated.checkpoints.directories import MANIFEST, read_manifest
from pytorch_accelerated.checkpoints.files import CheckpointFileError
from tests.helpers import as_version_1, assert_equal_nested, make_regression_data, snapshot
from tests.helpers import make_trainer as make_any_trainer

make_trainer = functools.partial(make_any_trainer, optimizer_class=torch.optim.Adam, lr=0.1)


def trained() -> Trainer:
    trainer = make_trainer()
    trainer.train(make_regression_data(8), num_epochs=1, per_device_batch_size=4)
    return trainer


def test_save_checkpoint_writes_the_files_crc32_beside_it_and_the_file_loads_with_plain_torch_load(
    tmp_path: Path,
) -> None:
    trainer = trained()
    trainer.save_checkpoint(tmp_path / "ckpt.pt")
    assert (
        tmp_path / "ckpt.pt.crc32"
    ).read_text() == f"{zlib.crc32((tmp_path / 'ckpt.pt').read_bytes()):08x}\n"
    loaded = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert_equal_nested(loaded["model_state_dict"], trainer.get_model().state_dict())


def unverified_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if "without checking its bytes" in str(w.message)]


def test_a_checkpoint_without_its_crc32_loads_unchecked_with_one_warning_saying_so(tmp_path: Path) -> None:
    """As files written by 0.1.61, earlier versions or torch.save do, and copies that left it behind."""
    trainer = trained()
    trainer.save_checkpoint(tmp_path / "ckpt.pt")
    (tmp_path / "ckpt.pt.crc32").unlink()
    other = make_trainer(seed=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        other.load_checkpoint(tmp_path / "ckpt.pt")
    assert_equal_nested(snapshot(other), snapshot(trainer))
    assert unverified_warnings(caught) == [
        f"Loaded {tmp_path / 'ckpt.pt'} without checking its bytes: there is no {tmp_path / 'ckpt.pt.crc32'} "
        f"beside it (save_checkpoint writes one), so damage that still loads, such as a changed byte in a "
        f"tensor's data, would go unnoticed. Files written by torch.save, by pytorch-accelerated 0.1.x or by "
        f"earlier versions of this library have none; a copy may have left it behind. Copy ckpt.pt.crc32 "
        f"with the file, or save it again with save_checkpoint."
    ]
    assert caught[0].filename == __file__  # the warning points at the call to load_checkpoint


def test_a_checkpoint_with_its_crc32_loads_without_that_warning(tmp_path: Path) -> None:
    trained().save_checkpoint(tmp_path / "ckpt.pt")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_trainer(seed=1).load_checkpoint(tmp_path / "ckpt.pt")
    assert unverified_warnings(caught) == []


def test_a_checkpoint_replaced_by_hand_is_refused_saying_to_delete_the_old_crc32(tmp_path: Path) -> None:
    trainer = trained()
    trainer.save_checkpoint(tmp_path / "ckpt.pt")
    torch.save({"model_state_dict": make_trainer(seed=2).get_model().state_dict()}, tmp_path / "ckpt.pt")
    before = snapshot(trainer)
    with pytest.raises(
        CheckpointFileError,
        match=r"ckpt.pt is damaged: its bytes changed after it was saved \(CRC-32 [0-9a-f]{8}; "
        r".*ckpt.pt.crc32 records [0-9a-f]{8}\). Nothing was loaded. .*delete its .crc32 file",
    ):
        trainer.load_checkpoint(tmp_path / "ckpt.pt")
    assert_equal_nested(snapshot(trainer), before)


def test_a_state_records_the_crc32_of_every_file_and_of_its_manifest(tmp_path: Path) -> None:
    trained().save_training_state(tmp_path / "state")
    manifest = read_manifest(tmp_path / "state")
    assert manifest is not None and manifest["version"] == 2
    assert sorted(manifest["crc32"]) == sorted(manifest["files"])
    for name, crc in manifest["crc32"].items():
        assert crc == f"{zlib.crc32((tmp_path / 'state' / name).read_bytes()):08x}"
    content = {key: value for key, value in manifest.items() if key != "manifest_crc32"}
    expected = zlib.crc32(json.dumps(content, indent=2, sort_keys=True).encode())
    assert manifest["manifest_crc32"] == f"{expected:08x}"


def test_a_manifest_changed_only_in_its_layout_is_refused(tmp_path: Path) -> None:
    """Its text must be what was written: a changed space is caught as well as a changed value."""
    trained().save_training_state(tmp_path / "state")
    path = tmp_path / "state" / MANIFEST
    path.write_text(path.read_text().replace('\n  "epoch"', '\n\t"epoch"'))
    assert json.loads(path.read_text())["epoch"] == 1
    with pytest.raises(
        ValueError, match=r"state/manifest.json is damaged: it does not match its own checksum"
    ):
        make_trainer().load_training_state(tmp_path / "state")


def test_a_state_saved_before_checksums_loads_unchecked(tmp_path: Path) -> None:
    trainer = trained()
    trainer.save_training_state(tmp_path / "state")
    path = tmp_path / "state" / MANIFEST
    path.write_text(json.dumps(as_version_1(json.loads(path.read_text())), indent=2))
    other = make_trainer(seed=1)
    other.load_training_state(tmp_path / "state")
    assert_equal_nested(snapshot(other), snapshot(trainer))
