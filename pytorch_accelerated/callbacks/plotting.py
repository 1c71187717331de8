"""Pictures of a run: :class:`PlotRunCallback` writes one PNG of the run's curves.

matplotlib is an extra (``pip install 'pytorch-accelerated[plots]'``), imported only when the
callback is created. The figure is drawn with ``matplotlib.figure.Figure`` on an Agg canvas, so
the user's pyplot backend and open figures are left alone.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._internal.validation import check_flag, check_whole_number
from .events import TrainerCallback
from .trackers import as_float

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from ..trainer import Trainer

__all__ = ["PlotRunCallback"]

#: The metrics drawn in the loss panel, as (name, kind of series, label): the step series first.
LOSS_CURVES = (
    ("train_loss", "step", "train_loss"),
    ("train_loss_epoch", "epoch", "train_loss_epoch"),
    ("eval_loss_epoch", "epoch", "eval_loss_epoch"),
)
LOSS_TITLE = "loss"
LR_TITLE = "learning rate"

Points = list[tuple[int, float]]


class PlotRunCallback(TrainerCallback):
    """Write one PNG of the run at its end (also after a stop) and, with ``every_epoch=True``,
    after every epoch, replacing the same file each time (written atomically).

    Panels, all against the optimizer update step (the number of completed updates):

    - ``loss``: the step series ``train_loss`` when step metrics are recorded (e.g. by
      :class:`~pytorch_accelerated.callbacks.TrackingCallback`), and ``train_loss_epoch`` /
      ``eval_loss_epoch`` at the update step where each epoch ended;
    - ``learning rate``: the step series ``lr`` or ``lr_group_i``, when recorded;
    - every other recorded metric, epoch-level or step series, in its own panel named after it.

    An epoch-level value is drawn at the update step where the epoch it was recorded in ended,
    whatever the order of the callbacks (one recorded after the last epoch ended, e.g. in a
    stopped epoch, at the step where the run ended). Those steps are part of the callback's
    state, so a run resumed with ``train(resume_from=...)`` draws the same picture as an
    uninterrupted one. Values that are not single numbers are not drawn. Only the main process
    draws and writes; matplotlib's pyplot (and its backend) is not used.

    Args:
        path: the PNG file to write (its folder is created).
        every_epoch: also write the picture after each epoch.
        dpi: resolution of the PNG.
        columns: panels per row.

    Attributes:
        panel_titles: the titles of the panels last drawn, in order (also in the PNG's
            ``Panels`` text field, as a JSON list).

    Raises:
        ImportError: if matplotlib is not installed.
        ValueError: if ``path`` does not end in ``.png`` or lies under a file.
    """

    def __init__(
        self,
        path: str | os.PathLike = "run.png",
        every_epoch: bool = False,
        *,
        dpi: int = 100,
        columns: int = 3,
    ) -> None:
        require_matplotlib("PlotRunCallback")
        check_flag(every_epoch, "PlotRunCallback: every_epoch")
        self.path = checked_png_path(path, "PlotRunCallback")
        self.every_epoch = every_epoch
        self.dpi = check_whole_number(dpi, "dpi", owner="PlotRunCallback")
        self.columns = check_whole_number(columns, "columns", owner="PlotRunCallback")
        self.panel_titles: list[str] = []
        # Values recorded before this run started (reset_run_history=False) are not drawn.
        self._first: dict[str, dict[str, int]] = {"epoch": {}, "step": {}}
        # For each ended epoch: its last update step and how many values each metric had at its
        # end. The step is known when the epoch's training ends (before any state is saved at the
        # epoch's end); the counts are completed when the next epoch starts (_counts_pending).
        self._epoch_ends: list[tuple[int, dict[str, int]]] = []
        self._counts_pending = False

    # ------------------------------------------------------------------ when to draw

    def on_training_run_start(self, trainer: Trainer, **kwargs: Any) -> None:
        history = trainer.run_history
        self._first = {
            "epoch": {name: len(history.get_metric_values(name)) for name in history.get_metric_names()},
            "step": {
                name: len(history.get_step_metric_values(name)) for name in history.get_step_metric_names()
            },
        }
        self._epoch_ends, self._counts_pending = [], False

    def on_train_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        self._epoch_ends.append((trainer.progress.global_step, trainer.run_history.metric_counts()))
        self._counts_pending = True

    def on_train_epoch_start(self, trainer: Trainer, **kwargs: Any) -> None:
        """Count the values recorded since the last epoch's training ended (its evaluation, and
        every callback at its end, whatever their order) as that epoch's."""
        if self._counts_pending and self._epoch_ends:
            self._epoch_ends[-1] = (self._epoch_ends[-1][0], trainer.run_history.metric_counts())
        self._counts_pending = False

    def on_training_run_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        if self.every_epoch:
            self.write(trainer)

    def on_training_run_end(self, trainer: Trainer, **kwargs: Any) -> None:
        self.write(trainer)

    def state_dict(self) -> dict[str, Any]:
        return {
            "first": {kind: dict(counts) for kind, counts in self._first.items()},
            "epoch_ends": [[step, dict(counts)] for step, counts in self._epoch_ends],
            "counts_pending": self._counts_pending,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._first = {kind: dict(counts) for kind, counts in state["first"].items()}
        self._epoch_ends = [(int(step), dict(counts)) for step, counts in state["epoch_ends"]]
        self._counts_pending = bool(state["counts_pending"])

    # ------------------------------------------------------------------ what to draw

    def panels(self, trainer: Trainer) -> dict[str, dict[str, Points]]:
        """The curves of each panel, by panel title: ``{title: {label: [(step, value), ...]}}``."""
        series = {
            "epoch": {
                name: self._epoch_points(trainer, name) for name in trainer.run_history.get_metric_names()
            },
            "step": {
                name: self._step_points(trainer, name) for name in trainer.run_history.get_step_metric_names()
            },
        }
        panels = {
            LOSS_TITLE: _drawn({label: series[kind].pop(name, []) for name, kind, label in LOSS_CURVES})
        }
        learning_rates = {
            name: series["step"].pop(name)
            for name in sorted(series["step"])
            if name == "lr" or name.startswith("lr_group_")
        }
        others = [
            (name, {f"{name} (epoch)": series["epoch"].get(name, []), name: series["step"].get(name, [])})
            for name in sorted(set(series["epoch"]) | set(series["step"]))
        ]
        for title, curves in [(LR_TITLE, learning_rates), *others]:
            if drawn := _drawn(curves):
                panels[title] = drawn
        return panels

    def _epoch_points(self, trainer: Trainer, name: str) -> Points:
        """Each value of epoch metric ``name`` at the step of the epoch end that first saw it
        (a value recorded since the last epoch end, e.g. in a stopped epoch, at the current step)."""
        values = trainer.run_history.get_metric_values(name)
        return [
            (
                next(
                    (step for step, counts in self._epoch_ends if counts.get(name, 0) > index),
                    trainer.progress.global_step,
                ),
                value,
            )
            for index in range(self._first["epoch"].get(name, 0), len(values))
            if (value := as_float(values[index])) is not None
        ]

    def _step_points(self, trainer: Trainer, name: str) -> Points:
        points = trainer.run_history.get_step_metric_values(name)[self._first["step"].get(name, 0) :]
        return [
            (step, value)
            for step, value in ((step, as_float(value)) for step, value in points)
            if value is not None
        ]

    # ------------------------------------------------------------------ drawing and writing

    def write(self, trainer: Trainer) -> None:
        """Draw the run and replace :attr:`path` with it (main process only).

        A plot that cannot be written is reported with a warning, not an error: the run (and
        the other processes, which may be waiting in a collective) carries on.
        """
        if not trainer.is_world_process_zero:
            return
        panels = self.panels(trainer)
        self.panel_titles = list(panels)
        figure = self._draw(panels, sorted({step for step, _ in self._epoch_ends}))
        try:
            write_png(figure, self.path, self.dpi, {"Panels": json.dumps(self.panel_titles)})
        except OSError as error:
            warnings.warn(
                f"PlotRunCallback could not write the plot to {str(self.path)!r}: {error}. Check that its "
                f"folder can be created and written to (and that the disk has space).",
                stacklevel=2,
            )

    def _draw(self, panels: Mapping[str, Mapping[str, Points]], epoch_ends: list[int]) -> Figure:
        columns = min(self.columns, len(panels))
        rows = math.ceil(len(panels) / columns)
        figure = new_figure(5.0 * columns, 3.4 * rows)
        for index, (title, curves) in enumerate(panels.items()):
            _draw_panel(figure.add_subplot(rows, columns, index + 1), title, curves, epoch_ends)
        return figure


def _draw_panel(axes: Axes, title: str, curves: Mapping[str, Points], epoch_ends: list[int]) -> None:
    for label, points in curves.items():
        steps, values = zip(*points, strict=True) if points else ((), ())
        axes.plot(steps, values, "-" if len(points) > 20 else "o-", label=label, markersize=4, linewidth=1.2)
    for step in epoch_ends:
        axes.axvline(step, color="0.85", linewidth=0.8, zorder=0)
    if not curves:
        axes.text(0.5, 0.5, "nothing recorded yet", ha="center", va="center", transform=axes.transAxes)
    axes.set(title=title, xlabel="optimizer update step")
    axes.grid(alpha=0.3)
    if len(curves) > 1 or title == LOSS_TITLE and curves:
        axes.legend(fontsize="small")


def _drawn(curves: Mapping[str, Points]) -> dict[str, Points]:
    """The curves that have points (a panel shows no empty legend entries)."""
    return {label: points for label, points in curves.items() if points}


# ---------------------------------------------------------------------------- shared with other pictures
# (the learning-rate range test's plot, pytorch_accelerated.lr_finder)


def require_matplotlib(owner: str) -> None:
    """Raise an ``ImportError`` naming ``owner`` and the extra to install when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401 (checked here; the drawing imports what it needs)
    except ImportError as error:
        raise ImportError(
            f"{owner} needs matplotlib, which is not installed: "
            "pip install 'pytorch-accelerated[plots]'  (or pip install matplotlib)."
        ) from error


def checked_png_path(path: str | os.PathLike, owner: str) -> Path:
    """``path`` as a ``Path``, if it names a PNG file that can be written (no file among its folders)."""
    checked, called = Path(path), f"{owner}(path={str(path)!r})"
    if checked.suffix.lower() != ".png":
        raise ValueError(f"{called}: the plot is a PNG file; give a path ending in '.png'.")
    for parent in checked.parents:
        if parent.exists() and not parent.is_dir():
            raise ValueError(
                f"{called}: {str(parent)!r} is a file, so the plot cannot be written under it; choose a "
                f"path in a folder."
            )
    return checked


def new_figure(width: float, height: float) -> Figure:
    """A matplotlib ``Figure`` of that size (inches) on its own Agg canvas: no pyplot, no global backend."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(figure)  # attaches itself
    return figure


def write_png(figure: Figure, path: Path, dpi: int, metadata: dict[str, str]) -> None:
    """Write ``figure`` to ``path`` as a PNG with text ``metadata``, atomically: written beside it,
    then renamed, so ``path`` is never half-written; on an ``OSError`` nothing is left behind."""
    partial = path.with_name(f".{path.name}.partial")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(partial, format="png", dpi=dpi, metadata=metadata)
        os.replace(partial, path)
    except OSError:
        if partial.parent.is_dir():
            partial.unlink(missing_ok=True)
        raise
