"""What the Trainer's ``predict`` does: the model's outputs for every sample of a data set, in its
order, each sample exactly once on any number of processes.

Prediction runs on evaluation's loaders: ``create_eval_dataloader`` gives each process its own
share of the samples (a :class:`~pytorch_accelerated.data.ShardedEvalBatchSampler`: process
``p`` of ``P`` takes samples ``p, p + P, ...``), all processes run the same number of batches,
and the padding batches of zero rows that even them out (see
:attr:`~pytorch_accelerated.trainer.Trainer.eval_batch_is_padding`) contribute nothing. After
each batch, the outputs and the indices of their samples are gathered from every process and
moved to the CPU, so device memory holds one batch at a time; at the end the rows are put back
in data-set order by those indices.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, cast

import torch
from accelerate import Accelerator
from torch import nn

from ._internal.argument_checks import (
    check_collate_fn,
    check_dataloader_kwargs,
    check_not_a_dataloader,
    check_whole_number,
)
from ._internal.distributed import gather_ragged
from .data import DeviceDataLoader, ShardedEvalBatchSampler, is_map_style

#: ``dataloader_kwargs`` that would change which samples are predicted, or their order.
_ORDER_CHANGING_KWARGS = ("sampler", "batch_sampler", "shuffle", "drop_last")


def predict(
    accelerator: Accelerator,
    model: nn.Module,
    loader: DeviceDataLoader,
    batches: Iterable[Any],
    predict_batch: Callable[[Any], Any],
    padding: Callable[[], bool],
    num_samples: int,
    padding_value: float,
) -> Any:
    """The model's outputs for every sample of the data set behind ``loader``, in data-set order, on
    the CPU: what :meth:`Trainer.predict <pytorch_accelerated.trainer.Trainer.predict>` returns.
    ``batches`` are those of ``loader``, the prepared evaluation loader; ``padding()`` says whether
    the current one is a padding batch; ``predict_batch`` is the Trainer's
    ``calculate_predict_batch_outputs``. Every process must call this.
    """
    was_training = model.training
    model.eval()
    # Each batch is predicted and gathered from every process: the first batch's outputs give
    # the structure; ``gathered`` holds, per batch, ``[sample indices, *output tensors]`` on the CPU.
    structure: Any = None
    paths: list[str] = []
    gathered: list[list[torch.Tensor]] = []
    try:
        with torch.no_grad():
            for batch, sample_indices in zip(batches, loader.batch_sampler, strict=True):
                outputs = predict_batch(batch)
                if padding():  # a batch of zero rows (the sampler names the sample it was cut from)
                    sample_indices = []
                leaves = output_leaves(outputs)
                if structure is None:
                    structure, paths = outputs, [path for path, _ in leaves]
                check_batch_leaves(leaves, paths, len(sample_indices))
                tensors = [
                    torch.tensor(sample_indices, dtype=torch.int64, device=accelerator.device),
                    *(tensor.detach() for _, tensor in leaves),
                ]
                gathered.append(gather_rows(accelerator, tensors, padding_value, padding()))
    finally:
        model.train(was_training)
    return in_dataset_order(structure, gathered, num_samples, padding_value)


def model_outputs(model: nn.Module, batch: Any) -> Any:
    """What the default ``calculate_predict_batch_outputs`` returns: ``model(**batch)`` for a mapping,
    ``model(batch[0])`` for a tuple or list, else ``model(batch)``."""
    if isinstance(batch, Mapping):
        return model(**batch)
    if isinstance(batch, (tuple, list)):
        return model(batch[0])
    return model(batch)


def check_predict_loader(loader: Any) -> None:
    """Fail unless ``loader`` (from ``create_eval_dataloader``) splits the data set with a
    :class:`~pytorch_accelerated.data.ShardedEvalBatchSampler`, which tells each batch's samples."""
    if not isinstance(loader.batch_sampler, ShardedEvalBatchSampler):
        raise TypeError(
            f"predict() needs the loader from create_eval_dataloader to split the data set with a "
            f"ShardedEvalBatchSampler (as the default one does), to put the outputs back in data-set "
            f"order; got a {type(loader.batch_sampler).__name__}. Let an override of "
            f"create_eval_dataloader keep the default batch sampler, or override predict."
        )


def check_predict_arguments(
    dataset: Any, per_device_batch_size: Any, dataloader_kwargs: Any, collate_fn: Any, padding_value: Any
) -> None:
    """Check the arguments of ``predict()`` (as ``evaluate()``'s, plus what keeps the data-set order)."""
    check_whole_number(per_device_batch_size, "per_device_batch_size")
    check_not_a_dataloader(dataset, "dataset")
    if not is_map_style(dataset):
        raise TypeError(
            f"predict() needs a map-style data set (a torch Dataset with __len__ and __getitem__), got "
            f"{type(dataset).__name__}: its outputs are returned in data-set order, by index. For a "
            f"stream, collect its samples into a list or a TensorDataset first."
        )
    if len(dataset) == 0:
        raise ValueError(
            f"predict() got an empty dataset ({type(dataset).__name__}, len 0): there is nothing to "
            f"predict. Pass a data set with at least one sample; if it was filtered or split, check that step."
        )
    check_dataloader_kwargs(dataloader_kwargs, "dataloader_kwargs")
    changing = [key for key in _ORDER_CHANGING_KWARGS if (dataloader_kwargs or {}).get(key)]
    if changing:
        raise ValueError(
            f"predict() returns an output for every sample in data-set order, so dataloader_kwargs may "
            f"not set {', '.join(changing)} (got {dict(dataloader_kwargs or {})!r}). Remove it; to "
            f"predict on some samples, pass torch.utils.data.Subset(dataset, indices)."
        )
    check_collate_fn(collate_fn)
    if isinstance(padding_value, bool) or not isinstance(padding_value, (int, float)):
        raise TypeError(f"padding_value must be a number (e.g. 0 or -100), got {padding_value!r}.")


def output_leaves(outputs: Any, path: str = "outputs") -> list[tuple[str, torch.Tensor]]:
    """The tensors of ``outputs`` (nested mappings, tuples and lists) with their paths, in order."""
    if isinstance(outputs, torch.Tensor):
        return [(path, outputs)]
    if isinstance(outputs, Mapping):
        return [leaf for key, value in outputs.items() for leaf in output_leaves(value, f"{path}[{key!r}]")]
    if isinstance(outputs, (tuple, list)):
        return [leaf for i, value in enumerate(outputs) for leaf in output_leaves(value, f"{path}[{i}]")]
    raise TypeError(
        f"calculate_predict_batch_outputs returned {path} = {type(outputs).__name__}, not a tensor: "
        f"predict() needs a tensor, or dicts, tuples and lists of tensors. Override "
        f"calculate_predict_batch_outputs to return only the tensors you need."
    )


def check_batch_leaves(leaves: list[tuple[str, torch.Tensor]], paths: list[str], num_samples: int) -> None:
    """Fail unless a batch's outputs have the first batch's structure and one row per sample."""
    if [path for path, _ in leaves] != paths:
        raise ValueError(
            f"calculate_predict_batch_outputs returned tensors at {[path for path, _ in leaves]} for one "
            f"batch and at {paths} for the first: every batch must give the same structure."
        )
    for path, tensor in leaves:
        if tensor.dim() == 0 or tensor.shape[0] != num_samples:
            raise ValueError(
                f"calculate_predict_batch_outputs returned {path} of shape {tuple(tensor.shape)} for a batch of "
                f"{num_samples} samples: predict() needs one row per sample along dim 0 (a per-batch "
                f"value such as a loss cannot be split into samples). Override "
                f"calculate_predict_batch_outputs to return only per-sample tensors, e.g. outputs.logits."
            )


def pad_to(tensor: torch.Tensor, sizes: list[int], padding_value: float) -> torch.Tensor:
    """``tensor`` padded at the end of dims 1, 2, ... to ``sizes`` with ``padding_value`` (a
    tensor of no rows, such as a padding batch's, takes ``sizes`` whatever its own)."""
    if list(tensor.shape[1:]) == sizes:
        return tensor
    if tensor.shape[0] == 0:
        return tensor.new_empty((0, *sizes))
    padded = tensor.new_full((tensor.shape[0], *sizes), padding_value)
    padded[tuple(slice(0, size) for size in tensor.shape)] = tensor
    return padded


def gather_rows(
    accelerator: Accelerator, tensors: list[torch.Tensor], padding_value: float, padding: bool
) -> list[torch.Tensor]:
    """Gather ``tensors`` (each with one row per sample) from every process onto the CPU, their
    dims beyond 0 first padded to the largest on any process; a ``padding`` batch (zero rows)
    adds no row and its sizes do not count."""
    if accelerator.num_processes > 1:
        local = [0 if padding else size for tensor in tensors for size in tensor.shape[1:]] or [0]
        largest = (
            accelerator.gather(torch.tensor(local, dtype=torch.int64, device=accelerator.device))
            .reshape(accelerator.num_processes, -1)
            .amax(dim=0)
            .tolist()
        )
        sizes = iter(largest)  # each tensor's dims beyond 0 take the next sizes
        tensors = [
            pad_to(tensor, list(itertools.islice(sizes, tensor.dim() - 1)), padding_value)
            for tensor in tensors
        ]
    return [tensor.cpu() for tensor in gather_ragged(accelerator, tensors, padding=padding)]


def in_dataset_order(
    structure: Any, batches: list[list[torch.Tensor]], num_samples: int, padding_value: float
) -> Any:
    """Concatenate the gathered batches (``[indices, *outputs]`` each), padding ragged dims,
    reorder the rows by sample index and rebuild the outputs' ``structure``."""
    indices = torch.cat([batch[0] for batch in batches])
    if not torch.equal(indices.sort().values, torch.arange(num_samples)):  # each sample once
        raise RuntimeError(f"predict() gathered samples {indices.tolist()} for a data set of {num_samples}.")
    order = torch.argsort(indices)
    columns = ([batch[i] for batch in batches] for i in range(1, len(batches[0])))
    return rebuild(structure, (concatenate_padded(column, padding_value)[order] for column in columns))


def concatenate_padded(tensors: list[torch.Tensor], padding_value: float) -> torch.Tensor:
    """``torch.cat`` along dim 0 after padding dims beyond 0 to the largest of ``tensors``."""
    sizes = [max(tensor.shape[dim] for tensor in tensors) for dim in range(1, tensors[0].dim())]
    if any(tensor.dim() != tensors[0].dim() for tensor in tensors):
        raise ValueError(
            f"calculate_predict_batch_outputs returned tensors of different numbers of dimensions "
            f"({sorted({tensor.dim() for tensor in tensors})}) at the same place in different batches."
        )
    return torch.cat([pad_to(tensor, sizes, padding_value) for tensor in tensors])


def rebuild(structure: Any, leaves: Iterator[torch.Tensor]) -> Any:
    """``structure`` (as :func:`output_leaves` walks it) with each tensor replaced by the next of ``leaves``."""
    if isinstance(structure, torch.Tensor):
        return next(leaves)
    if isinstance(structure, Mapping):
        values = {key: rebuild(value, leaves) for key, value in structure.items()}
        # As the type of ``structure`` (an ``OrderedDict``, a transformers ``ModelOutput``) where
        # it can be built from a dict, else as a dict.
        with contextlib.suppress(TypeError, ValueError):
            return values if type(structure) is dict else cast(Any, type(structure))(values)
        return values
    values_list = [rebuild(value, leaves) for value in structure]
    if isinstance(structure, tuple):
        return type(structure)(*values_list) if hasattr(structure, "_fields") else tuple(values_list)
    return values_list
