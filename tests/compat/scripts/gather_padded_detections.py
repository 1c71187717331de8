"""Gathering padded detections as the original's object-detection example does.

Each image has a different number of predicted boxes. Every process pads its boxes to a fixed
number of rows with -1, gathers them with ``trainer.gather(t, padding_value=-1)``, and gets back
only the real rows: the padding rows are stripped, as in 0.1.61 (docs/migration.md). The worked
example there (process 0 holds ``[[1,2],[3,4]]``, process 1 holds ``[[5,6]]``) gives 3 rows on 2
processes.
"""

import torch
from torch import nn, optim
from torch.utils.data import Dataset

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import TrainerCallback

MAX_BOXES = 5


class ToyDetections(Dataset):
    """Image i has i % 4 boxes: (x1, y1, x2, y2, score, class, image_id) per row."""

    def __len__(self):
        return 12

    def __getitem__(self, index):
        num_boxes = index % 4
        boxes = torch.tensor([[1.0, 2.0, 3.0, 4.0, 0.5, float(k), float(index)] for k in range(num_boxes)])
        padded = torch.full((MAX_BOXES, 7), -1.0)
        padded[:num_boxes] = boxes.reshape(num_boxes, 7)
        return torch.zeros(2), padded


class GatherDetections(TrainerCallback):
    def __init__(self):
        self.detections = []

    def on_eval_step_end(self, trainer, batch, batch_output, **kwargs):
        _, padded = batch
        rows = padded.reshape(-1, 7)
        # Drop the padding of this process first (varying length), then pad across processes.
        rows = rows[rows[:, 0] != -1]
        if rows.shape[0] == 0:
            rows = torch.full((1, 7), -1.0)
        self.detections.append(trainer.gather(rows, padding_value=-1))


def main():
    model = nn.Linear(2, 1)
    trainer = Trainer(
        model,
        loss_func=lambda out, target: out.sum() * 0,
        optimizer=optim.SGD(model.parameters(), lr=0.1),
        callbacks=(GatherDetections(),),
    )
    trainer.evaluate(dataset=ToyDetections(), per_device_batch_size=4)
    gatherer = trainer.callback_handler.callbacks[0]
    detections = torch.cat(gatherer.detections)
    assert (detections != -1).all(), f"padding rows were gathered:\n{detections}"
    # Images 0..11 have 0,1,2,3,0,1,2,3,0,1,2,3 boxes: 18 in all, each gathered once.
    assert detections.shape == (18, 7), detections.shape
    assert sorted(detections[:, 6].tolist()) == sorted(float(i) for i in range(12) for _ in range(i % 4))

    # The worked example of docs/migration.md: 3 rows, the padding row stripped.
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    rank, world_size = (
        (torch.distributed.get_rank(), torch.distributed.get_world_size()) if distributed else (0, 1)
    )
    mine = torch.tensor([[1, 2], [3, 4]]) if rank == 0 else torch.tensor([[5, 6]])
    gathered = trainer.gather(mine, padding_value=-1)
    if world_size == 2:
        assert gathered.tolist() == [[1, 2], [3, 4], [5, 6]], gathered.tolist()
    if trainer.is_world_process_zero:
        print(f"COMPAT OK gather_padded rows={detections.shape[0]} example_rows={gathered.shape[0]}")


if __name__ == "__main__":
    main()
