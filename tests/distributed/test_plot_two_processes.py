"""PlotRunCallback on a real group of 2 processes: only the main process draws and writes.

Each rank is given its own path (``rank{RANK}/run.png``), so a write by rank 1 would show as a
file: only rank 0's exists, and rank 1 drew no panel.
"""

from __future__ import annotations

import json
from pathlib import Path

from PIL import Image

from tests.launch import launch_workers


def test_only_the_main_process_writes_the_plot(tmp_path: Path) -> None:
    run = launch_workers("plot_worker.py", tmp_path, nproc=2)
    ranks = run.results
    assert [r["num_processes"] for r in ranks] == [2, 2], run.describe()

    assert sorted(path.name for path in tmp_path.glob("rank*") if path.is_dir()) == ["rank0"]
    assert sorted(path.name for path in (tmp_path / "rank0").iterdir()) == ["run.png"]
    with Image.open(tmp_path / "rank0" / "run.png") as image:
        image.load()
        assert json.loads(image.text["Panels"]) == ranks[0]["panel_titles"]
    assert ranks[0]["panel_titles"][:2] == ["loss", "learning rate"]
    assert ranks[1]["panel_titles"] == []
    # Both ranks know the same curves (the step loss is averaged over the processes).
    assert (
        ranks[0]["loss_steps"]
        == ranks[1]["loss_steps"]
        == {
            "train_loss": [2, 4, 6, 8],
            "train_loss_epoch": [4, 8],
            "eval_loss_epoch": [4, 8],
        }
    )
