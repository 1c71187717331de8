"""The release check's smoke test, run by scripts/release-check.sh with the Python of the clean
virtual environment the wheel was installed into, from a directory outside the repository.

It checks that the installed copy of the package is the one imported, trains a small model for
2 epochs on a few samples while saving training states, resumes a second run from the state
saved in the middle of the first epoch and checks that it ends bitwise equal to the first,
loads a checkpoint back, and prints the versions::

    python -I scripts/release_smoke.py WORK_DIR
"""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

import accelerate
import torch
from torch import nn
from torch.utils.data import TensorDataset

import pytorch_accelerated
from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import SaveTrainingStateCallback
from pytorch_accelerated.trainer import DEFAULT_CALLBACKS

NUM_SAMPLES = 48
BATCH_SIZE = 8  # 6 updates per epoch
SAVE_EVERY_N_STEPS = 3


def check_installed_copy() -> Path:
    site_packages = Path(sysconfig.get_paths()["purelib"]).resolve()
    package_file = Path(pytorch_accelerated.__file__).resolve()
    if site_packages not in package_file.parents:
        raise SystemExit(
            f"pytorch_accelerated was imported from {package_file}, not from this environment's "
            f"site-packages ({site_packages}): run this from outside the repository, with python -I."
        )
    return package_file


def make_trainer(save_dir: Path | None) -> Trainer:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 2))
    callbacks: tuple = DEFAULT_CALLBACKS
    if save_dir is not None:
        callbacks = (
            *DEFAULT_CALLBACKS,
            SaveTrainingStateCallback(str(save_dir), save_every_n_steps=SAVE_EVERY_N_STEPS),
        )
    return Trainer(
        model, nn.CrossEntropyLoss(), torch.optim.AdamW(model.parameters(), lr=0.01), callbacks=callbacks
    )


def train(trainer: Trainer, dataset: TensorDataset, resume_from: Path | None = None) -> None:
    trainer.train(
        train_dataset=dataset,
        eval_dataset=dataset,
        num_epochs=2,
        per_device_batch_size=BATCH_SIZE,
        resume_from=None if resume_from is None else str(resume_from),
    )


def weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {name: value.detach().clone() for name, value in trainer.get_model().state_dict().items()}


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    work_dir = Path(sys.argv[1])
    package_file = check_installed_copy()
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(NUM_SAMPLES, 4, generator=generator)
    dataset = TensorDataset(features, (features.sum(dim=1) > 0).long())

    uninterrupted = make_trainer(work_dir / "states")
    train(uninterrupted, dataset)
    mid_epoch = work_dir / "states" / f"step_{SAVE_EVERY_N_STEPS}"
    resumed = make_trainer(None)
    train(resumed, dataset, resume_from=mid_epoch)
    expected, got = weights(uninterrupted), weights(resumed)
    if expected.keys() != got.keys() or not all(torch.equal(expected[k], got[k]) for k in expected):
        raise SystemExit(
            f"the run resumed from {mid_epoch} did not end bitwise equal to the uninterrupted run"
        )
    for metric in ("train_loss_epoch", "eval_loss_epoch"):
        if resumed.run_history.get_metric_values(metric) != uninterrupted.run_history.get_metric_values(
            metric
        ):
            raise SystemExit(f"the resumed run's {metric} history differs from the uninterrupted run's")

    uninterrupted.save_checkpoint(work_dir / "model.pt")
    loaded = make_trainer(None)
    loaded.load_checkpoint(work_dir / "model.pt")
    if not all(torch.equal(value, weights(loaded)[name]) for name, value in expected.items()):
        raise SystemExit("the checkpoint did not load back the trained weights")
    print(
        f"SMOKE OK pytorch_accelerated {pytorch_accelerated.__version__} from {package_file.parent}, "
        f"torch {torch.__version__}, accelerate {accelerate.__version__}"
    )


if __name__ == "__main__":
    main()
