"""PlotRunCallback on a group of processes: each rank is given its own path, writing after every
epoch and at the end; only rank 0 may write. Each rank reports the panels it drew (none on other
ranks) and the steps of its loss curves."""

from __future__ import annotations

import torch
from common import RegressionDataset, make_mlp, parse_args, rank, write_result
from torch import nn

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import PlotRunCallback, TrackingCallback, get_default_callbacks


def main() -> None:
    out = parse_args().out
    plot = PlotRunCallback(out / f"rank{rank()}" / "run.png", every_epoch=True)
    tracking = TrackingCallback(["csv"], log_every_n_steps=2, logging_dir=out / f"runs{rank()}")
    model = make_mlp(seed=0)
    trainer = Trainer(
        model,
        nn.MSELoss(),
        torch.optim.SGD(model.parameters(), lr=0.05),
        callbacks=[tracking, plot, *get_default_callbacks(progress_bar=False)],
    )
    # 32 samples, 2 processes x 4 per batch: 4 updates per epoch.
    trainer.train(
        RegressionDataset(32),
        eval_dataset=RegressionDataset(16, seed=2),
        num_epochs=2,
        per_device_batch_size=4,
    )
    loss = plot.panels(trainer)["loss"]
    write_result(
        out,
        {
            "num_processes": trainer.run_config.num_processes,
            "panel_titles": plot.panel_titles,
            "loss_steps": {label: [step for step, _ in points] for label, points in loss.items()},
        },
    )
    # Rank 0 draws at the end of the run while rank 1 is done: without this, rank 1's gloo
    # teardown at exit can abort the group before rank 0 has written its result.
    trainer.accelerator.wait_for_everyone()


if __name__ == "__main__":
    main()
