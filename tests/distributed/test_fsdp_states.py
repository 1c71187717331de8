"""Training states under FSDP: saved sharded by every process, resumed exactly in a new launch.

Proven here: FSDP2 (``fully_shard``) on CPU processes over gloo, through accelerate's own FSDP
code paths (``prepare``, ``save_fsdp_model`` / ``load_fsdp_model`` and the optimizer's), with the
engine type set by hand (``workers/fsdp_cpu.py``: accelerate enables FSDP only on accelerator
devices). FSDP1 and GPUs are not run here.

Launches (``workers/fsdp_states.py``), two at a time:

1. an uninterrupted FSDP run on 2 processes saving states every 4 updates, the same run under
   DDP (the plain Trainer), saving plain states, and under FSDP with ``FULL_STATE_DICT`` (resumed
   from its ``step_8`` by a new Trainer in the same launch);
2. from a NEW launch: the FSDP run resumed from a folder whose newest state has a truncated shard
   (skipped for ``step_8``, mid-epoch 2), then in the same launch the DDP run's plain ``step_8``
   resumed under FSDP (full state -> shards), then copies of ``step_8`` with one byte flipped
   each, all refused; and the sharded ``step_8`` resumed on 1 process.

The bad inputs that need no FSDP group are checked in this process on the states written.
"""

from __future__ import annotations

import pickle
import random
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from pytorch_accelerated import Trainer
from pytorch_accelerated.checkpoints import directories, sharded, state_checks
from tests.helpers import reseal_state
from tests.launch import WorkerRun, load_worker_module, start_workers

FULL = ("--state-dict-type", "FULL_STATE_DICT")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("fsdp_states")
    fsdp_states, ddp_states = root / "fsdp_states", root / "ddp_states"
    first = {
        "fsdp": start_workers(
            "fsdp_states.py", root / "fsdp", "--save-dir", str(fsdp_states), "--try-async", "1"
        ),
        "ddp": start_workers(
            "fsdp_states.py", root / "ddp", "--save-dir", str(ddp_states), "--engine", "ddp"
        ),
        "full": start_workers(
            "fsdp_states.py",
            root / "full",
            "--save-dir",
            str(root / "full_states"),
            *FULL,
            "--then-resume-from",
            str(root / "full_states" / "step_8"),
        ),
    }
    results: dict[str, Any] = {name: group.wait() for name, group in first.items()}
    folder = (
        root / "newest_damaged"
    )  # step_4, step_8 and step_12, whose model shard of process 1 is cut short
    for name in ("step_4", "step_8", "step_12"):
        shutil.copytree(fsdp_states / name, folder / name)
    shard = folder / "step_12" / "pytorch_model_fsdp_0" / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[:100])
    flipped = flipped_copies(fsdp_states / "step_8", root / "flipped")
    second = {
        "resumed": start_workers("fsdp_states.py", root / "resumed", "--save-dir", str(root / "s1"), "--resume-from", str(folder),
                                 "--then-resume-from", str(ddp_states / "step_8"), "--flipped-states", str(root / "flipped")),
        "on_one": start_workers("fsdp_states.py", root / "on_one", "--save-dir", str(root / "s2"),
                                "--resume-from", str(fsdp_states / "step_8"), nproc=1),
    }  # fmt: skip
    results.update({name: group.wait() for name, group in second.items()})
    return {
        **results,
        "fsdp_states": fsdp_states,
        "ddp_states": ddp_states,
        "full_states": root / "full_states",
        "damaged": shard,
        "flipped": flipped,
    }


FLIPS_PER_FILE = 2


def flipped_copies(state: Path, folder: Path) -> dict[str, tuple[Path, int]]:
    """Copies of ``state`` in ``folder``, each with one byte flipped at a seeded random offset of one
    of its files (``FLIPS_PER_FILE`` per file): by copy, the flipped file and the offset."""
    rng = random.Random(0)
    flipped = {}
    files = sorted(path.relative_to(state).as_posix() for path in state.rglob("*") if path.is_file())
    for index, name in enumerate(name for name in files for _ in range(FLIPS_PER_FILE)):
        copy = Path(shutil.copytree(state, folder / f"flip_{index:02d}"))
        data = bytearray((copy / name).read_bytes())
        offset = rng.randrange(len(data))
        data[offset] ^= rng.randrange(1, 256)
        (copy / name).write_bytes(bytes(data))
        flipped[copy.name] = (copy / name, offset)
    return flipped


def rank0(run: WorkerRun) -> dict[str, Any]:
    return run.results[0]


def test_a_sharded_state_lists_every_shard_and_records_how_it_was_sharded(runs: dict[str, Any]) -> None:
    state = runs["fsdp_states"] / "step_8"
    manifest = directories.read_manifest(state)
    assert manifest is not None and rank0(runs["fsdp"])["engine"] == "FSDP"
    assert manifest["sharded"] == {
        "engine": "FSDP",
        "fsdp_version": 2,
        "state_dict_type": "SHARDED_STATE_DICT",
        "num_processes": 2,
    }
    for part in ("pytorch_model_fsdp_0", "optimizer_0"):  # every process's shard, and DCP's metadata
        assert {f"{part}/__0_0.distcp", f"{part}/__1_0.distcp", f"{part}/.metadata"} <= set(manifest["files"])
    assert {"rng_state_0.pt", "rng_state_1.pt", "trainer_state.pt", "scheduler.pt"} <= set(manifest["files"])
    assert not {"model.pt", "optimizer.pt"} & set(manifest["files"])
    on_disk = {path.relative_to(state).as_posix() for path in state.rglob("*") if path.is_file()} - {
        "manifest.json"
    }
    assert on_disk == set(manifest["files"])
    assert sorted(path.name for path in runs["fsdp_states"].iterdir()) == [
        "final",
        "step_12",
        "step_4",
        "step_8",
    ]


def test_resumed_in_a_new_launch_it_ends_exactly_as_the_uninterrupted_run(runs: dict[str, Any]) -> None:
    uninterrupted, resumed = rank0(runs["fsdp"]), rank0(runs["resumed"])
    assert f"Skipped the training state {runs['damaged'].parents[1]}" in runs["resumed"].output
    assert "is truncated or corrupt" in runs["resumed"].output
    assert resumed["at_start"] == uninterrupted["at_saved_step"]  # the weights and optimizer of step_8
    assert resumed["at_start"]["optimizer"]["0.weight"]["step"] == 8.0
    assert (
        resumed["progress"]
        == uninterrupted["progress"]
        == {"epoch": 3, "global_step": 15, "batch_index": 0, "epoch_step": 0}
    )
    assert resumed["weights"] == uninterrupted["weights"]
    assert resumed["train_loss"] == uninterrupted["train_loss"] and len(resumed["train_loss"]) == 3
    assert resumed["eval_loss"] == uninterrupted["eval_loss"]


def test_with_full_state_dict_it_saves_whole_files_from_process_0_and_resumes_exactly(
    runs: dict[str, Any],
) -> None:
    """accelerate's FULL_STATE_DICT: the model and optimizer gathered into one file each."""
    manifest = directories.read_manifest(runs["full_states"] / "step_8")
    assert manifest is not None and manifest["sharded"]["state_dict_type"] == "FULL_STATE_DICT"
    assert {"pytorch_model_fsdp.bin", "optimizer.bin"} <= set(manifest["files"])
    uninterrupted = rank0(runs["full"])
    resumed = uninterrupted["then"]  # by a new Trainer in the same launch
    assert resumed["at_start"] == uninterrupted["at_saved_step"]
    assert resumed["weights"] == uninterrupted["weights"] == rank0(runs["fsdp"])["weights"]
    assert resumed["train_loss"] == uninterrupted["train_loss"] == rank0(runs["fsdp"])["train_loss"]


def test_the_fsdp_run_matches_the_ddp_run(runs: dict[str, Any]) -> None:
    fsdp, ddp = rank0(runs["fsdp"]), rank0(runs["ddp"])
    assert ddp["engine"] == "MULTI_CPU"
    assert fsdp["train_loss"] == pytest.approx(ddp["train_loss"], abs=1e-6)
    for name, value in ddp["weights"].items():
        assert torch.tensor(fsdp["weights"][name]) == pytest.approx(torch.tensor(value), abs=1e-6)


def test_a_plain_state_resumes_under_fsdp(runs: dict[str, Any]) -> None:
    """A state saved by the DDP run (model.pt, optimizer.pt) loads into the sharded model and
    optimizer, and the run then ends as the DDP run did."""
    ddp, resumed = (
        rank0(runs["ddp"]),
        rank0(runs["resumed"])["then"],
    )  # a new Trainer after the sharded resume
    assert resumed["engine"] == "FSDP"
    assert resumed["at_start"] == ddp["at_saved_step"]
    assert resumed["train_loss"] == pytest.approx(ddp["train_loss"], abs=1e-6)
    for name, value in ddp["weights"].items():
        assert torch.tensor(resumed["weights"][name]) == pytest.approx(torch.tensor(value), abs=1e-6)


def test_a_sharded_state_resumes_on_one_process(runs: dict[str, Any]) -> None:
    """DCP reshards the 2 processes' shards for 1; the position maps (docs: 'Resuming on
    another number of processes'): 24 samples of epoch 2 seen = batch 6 of 10 on 1 process."""
    saved, resumed = rank0(runs["fsdp"]), rank0(runs["on_one"])
    assert (resumed["engine"], resumed["world_size"]) == ("FSDP", 1)
    assert resumed["at_start"] == saved["at_saved_step"]
    assert resumed["progress"]["global_step"] == 8 + 4 + 10
    assert "mid-epoch: it was saved with 2 process(es)" in runs["on_one"].output


def test_every_single_byte_flip_in_a_sharded_state_is_refused_naming_the_file(runs: dict[str, Any]) -> None:
    """Each flipped copy of step_8 is refused on both processes before anything is loaded; one of
    them (the one that checked the file, or both) names the damaged file."""
    flipped, outcomes = runs["flipped"], [result["flips"] for result in runs["resumed"].results]
    assert len(flipped) == FLIPS_PER_FILE * 11  # manifest, 2 x (2 shards + .metadata), 2 RNG files, 2 more
    caught = 0
    for copy, (path, offset) in flipped.items():
        assert all(outcome[copy] is not None for outcome in outcomes), (path, offset)
        assert any(f"{path} is damaged" in outcome[copy]["message"] for outcome in outcomes), (path, offset)
        caught += 1
    print(f"\nsharded state: single-byte flips caught {caught} / tried {len(flipped)}")


def test_an_asynchronous_save_under_fsdp_is_refused_before_anything_is_written(runs: dict[str, Any]) -> None:
    for result in runs["fsdp"].results:
        assert result["async"]["written"] is False
        assert result["async"]["message"].startswith("Cannot save the training state")
        assert "asynchronously under FSDP" in result["async"]["message"]
        assert "asynchronous=False" in result["async"]["message"]


def test_a_shard_that_fails_to_write_on_one_process_fails_the_save_on_both_leaving_nothing(
    runs: dict[str, Any],
) -> None:
    """Process 1's optimizer shard exceeds its file-size limit inside DCP's collective save."""
    states = runs["fsdp_states"]
    for result in runs["fsdp"].results:
        assert (
            result["failed_save"]["type"] == "CheckpointWriteError" and result["failed_save"]["errno"] == 27
        )
        assert result["failed_save"]["message"] == (
            f"Could not save the training state to {states / 'failed'}: File too large (errno 27) while process 1 "
            f"wrote its shards into {states / '.failed.incomplete'}. Nothing was written; the previous states are "
            f"intact. Free space (or raise the file-size limit) or choose another folder."
        )
    assert sorted(path.name for path in states.iterdir()) == ["final", "step_12", "step_4", "step_8"]


def test_a_sharded_state_records_the_frozen_parameters_and_a_load_restores_them(runs: dict[str, Any]) -> None:
    """The first layer frozen, saved by hand, everything made trainable, loaded back: frozen again."""
    for result in runs["fsdp"].results:
        assert result["frozen"] == {"frozen": ["0.bias", "0.weight"], "record": ["0.weight", "0.bias"]}


# ---------------------------------------------------------------------------- in this process


def plain_trainer() -> Trainer:
    model = load_worker_module("common").make_mlp(seed=3)
    return Trainer(model, nn.MSELoss(), torch.optim.AdamW(model.parameters()), callbacks=())


@pytest.mark.parametrize("named", ["step_8", "folder"])
def test_a_sharded_state_loaded_without_fsdp_is_refused_before_anything_is_loaded(
    runs: dict[str, Any], named: str
) -> None:
    trainer = plain_trainer()
    before = {name: value.clone() for name, value in trainer.model.state_dict().items()}
    target = runs["fsdp_states"] / "step_8" if named == "step_8" else runs["fsdp_states"]
    with pytest.raises(sharded.ShardedStateError) as raised:
        trainer.load_training_state(target)
    message = str(raised.value)
    assert message.startswith(f"{runs['fsdp_states']}/")  # the state itself (the newest, from the folder)
    assert (
        "is a sharded training state: it was saved under FSDP (FSDP version 2 with state_dict_type=SHARDED_STATE_DICT, on 2 process(es))"
        in message
    )
    assert "Resume under the same FSDP configuration" in message
    assert (
        "save_checkpoint under FSDP" in message
        and "torch.distributed.checkpoint.format_utils.dcp_to_torch_save" in message
    )
    assert all(torch.equal(value, before[name]) for name, value in trainer.model.state_dict().items())
    assert trainer.progress.global_step == 0


def damaged_copy(runs: dict[str, Any], tmp_path: Path) -> Path:
    copy = tmp_path / "step_8"
    shutil.copytree(runs["fsdp_states"] / "step_8", copy)
    return copy


def check(state: Path, model: nn.Module | None = None) -> None:
    model = model or load_worker_module("common").make_mlp()
    manifest = directories.read_manifest(state)
    assert manifest is not None
    sharded.check_sharded_state(state, manifest, model, torch.optim.AdamW(model.parameters()), ranks=(0, 1))


def test_an_intact_sharded_state_passes_the_checks(runs: dict[str, Any], tmp_path: Path) -> None:
    check(damaged_copy(runs, tmp_path))


def test_a_truncated_shard_is_found_before_anything_is_loaded(runs: dict[str, Any], tmp_path: Path) -> None:
    state = damaged_copy(runs, tmp_path)
    shard = state / "optimizer_0" / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(
        state_checks.UnusableStateError,
        match=rf"{shard} is truncated or corrupt \(\d+ bytes, the metadata places \d+ bytes in it\)",
    ):
        check(state)


def test_a_missing_shard_or_metadata_is_named(runs: dict[str, Any], tmp_path: Path) -> None:
    state = damaged_copy(runs, tmp_path)
    (state / "pytorch_model_fsdp_0" / ".metadata").unlink()
    with pytest.raises(
        FileNotFoundError, match=rf"{state} is missing pytorch_model_fsdp_0/.metadata: the state was changed"
    ):
        check(state)


class RunsCode:
    def __reduce__(self) -> tuple[Any, ...]:
        return (print, ("this ran when the file was unpickled",))


def test_a_metadata_file_that_would_run_code_is_refused_unread(
    runs: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = damaged_copy(runs, tmp_path)
    (state / "optimizer_0" / ".metadata").write_bytes(pickle.dumps(RunsCode()))
    reseal_state(state)  # as whoever crafted it could: a checksum is no signature
    with pytest.raises(
        state_checks.UnusableStateError,
        match=r"is not torch.distributed.checkpoint's metadata: it names builtins.print",
    ):
        check(state)
    assert "this ran" not in capsys.readouterr().out


def test_shards_of_another_model_are_refused_naming_the_mismatch(
    runs: dict[str, Any], tmp_path: Path
) -> None:
    other = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))
    with pytest.raises(
        state_checks.StateMismatchError,
        match=r"size mismatch for 2.bias: \(2,\) in the file, \(3,\) in the model",
    ):
        check(damaged_copy(runs, tmp_path), other)


def test_the_state_saved_after_the_last_evaluation_holds_the_final_weights(
    runs: dict[str, Any], tmp_path: Path
) -> None:
    """``final`` is saved after the last evaluation (a forward pass with no backward): its shards
    hold the trained weights, read back with torch's own DCP converter."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    converted = tmp_path / "final_model.pt"
    dcp_to_torch_save(runs["fsdp_states"] / "final" / "pytorch_model_fsdp_0", converted)
    saved = torch.load(converted, weights_only=True)
    saved = saved.get("model", saved)
    weights = {name: value.double().tolist() for name, value in saved.items()}
    assert weights == rank0(runs["fsdp"])["weights"]
