"""Sharded models (FSDP2, DTensor parameters): their whole states, and their shards in training
states. Knows nothing of the Trainer.

Whole states, for single-file checkpoints (:mod:`.model_files`) and for a plain training state
loaded into a sharded run: the model's from accelerate's ``get_state_dict`` (or torch's
``get_model_state_dict`` on every writer), the optimizer's from torch's
``get_optimizer_state_dict(full_state_dict=True)``, renumbered as ``optimizer.state_dict()``
numbers parameters; loading goes the other way (``set_model_state_dict`` /
``set_optimizer_state_dict``), each process keeping its shards.

Shards, for training states under accelerate's FSDP engine (:class:`~.layouts.ShardedLayout`):
every process hands the model and optimizer to accelerate's ``save_fsdp_model`` /
``save_fsdp_optimizer`` (and ``load_fsdp_*``), which honour the plugin's ``state_dict_type`` and
handle FSDP1 and FSDP2: with ``SHARDED_STATE_DICT`` they write ``torch.distributed.checkpoint``
(DCP) directories, one ``.distcp`` file per process and a ``.metadata`` file::

    step_500/
        manifest.json                 "sharded": engine, FSDP version, state_dict_type, processes
        pytorch_model_fsdp_0/         __0_0.distcp, __1_0.distcp, .metadata
        optimizer_0/                  __0_0.distcp, __1_0.distcp, .metadata
        trainer_state.pt, scheduler.pt, rng_state_<rank>.pt, ...

(``FULL_STATE_DICT``: ``pytorch_model_fsdp.bin`` and ``optimizer.bin``, written by process 0.)
Before anything is loaded, :func:`check_sharded_state` checks every file the manifest lists
(present, and its bytes against the CRC-32 recorded there), reads each DCP ``.metadata`` with an unpickler that admits only DCP's own metadata classes, and
checks the saved keys and shapes against the model and the optimizer. DCP reshards on load, so a
sharded state resumes on another number of processes.
"""

from __future__ import annotations

import contextlib
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import torch
from accelerate.optimizer import AcceleratedOptimizer
from accelerate.utils import DistributedType, send_to_device
from accelerate.utils.constants import OPTIMIZER_NAME
from torch import nn

from .._internal.fsdp import fsdp2_modules, is_dtensor, uses_fsdp
from . import file_checks, torch_files
from .directories import file_checksum


class ShardedStateError(ValueError):
    """A sharded training state, and a run whose configuration (no FSDP, another FSDP version or
    ``state_dict_type``) cannot load it."""


# ---------------------------------------------------------------------------- whole states of sharded models


def is_sharded(module: nn.Module) -> bool:
    """True when ``module`` is sharded by FSDP2 (``fully_shard``) or its parameters are sharded
    ``DTensor``s (tensor parallelism)."""
    return bool(fsdp2_modules(module)) or any(is_dtensor(parameter) for parameter in module.parameters())


def registered_shards(module: nn.Module) -> nn.Module:
    """``module``, with FSDP2's sharded parameters registered on it again.

    FSDP2 leaves the root module's parameters gathered (whole, plain tensors) after a forward
    pass that no backward pass follows, as in an evaluation, until its next forward pass: its
    parameters are then not those that the optimizer holds. Resharding is local to each process.
    """
    for part in fsdp2_modules(module):
        part.reshard()
    return module


def torch_optimizer(optimizer: Any) -> Any:
    """The ``torch.optim`` optimizer inside accelerate's wrapper."""
    return optimizer.optimizer if isinstance(optimizer, AcceleratedOptimizer) else optimizer


def _holds_shards(optimizer: Any) -> bool:
    return any(
        is_dtensor(parameter)
        for group in torch_optimizer(optimizer).param_groups
        for parameter in group["params"]
    )


def refuse_fsdp1_optimizer(accelerator: Any, optimizer: Any, method: str, argument: str) -> None:
    """Refuse, before anything is read or written, to move a whole optimizer state in or out of
    FSDP version 1, whose optimizer holds flattened shards: only FSDP2's is gathered here."""
    if (
        optimizer is not None
        and accelerator.distributed_type == DistributedType.FSDP
        and not accelerator.is_fsdp2
    ):
        raise ValueError(
            f"{method} cannot move the whole optimizer state under FSDP version 1 (accelerate's "
            f"fsdp_version=1), whose optimizer holds flattened shards; only FSDP2's is supported. Use FSDP2 "
            f"(FullyShardedDataParallelPlugin(fsdp_version=2), or `accelerate launch --use_fsdp --fsdp_version 2`), "
            f"or pass {method}(..., {argument}=False); save_training_state saves the sharded optimizer state."
        )


def full_model_state(accelerator: Any, model: nn.Module, everywhere: bool) -> dict[str, Any]:
    """``model``'s whole state dict, on the CPU: on the main process only (accelerate's
    ``get_state_dict``), or on every process when ``everywhere`` (each node's writer needs it).
    A collective for a sharded model: every process must call this."""
    if not everywhere:
        return cast(dict[str, Any], accelerator.get_state_dict(model))
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return cast(
        dict[str, Any],
        send_to_device(
            get_model_state_dict(
                registered_shards(accelerator.unwrap_model(model, keep_torch_compile=False)),
                options=StateDictOptions(full_state_dict=True),
            ),
            "cpu",
        ),
    )


def full_optimizer_state(plain_model: nn.Module, optimizer: Any, everywhere: bool = False) -> dict[str, Any]:
    """``optimizer``'s whole state, as a plain optimizer's ``state_dict()``.

    Over sharded parameters (those of ``plain_model``, the unwrapped model) it is gathered (a
    collective: every process must call this), on the CPU, by the main process only (the others
    get an empty dict) unless ``everywhere``.
    """
    if not _holds_shards(optimizer):
        return cast(dict[str, Any], optimizer.state_dict())
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    state: dict[str, Any] = get_optimizer_state_dict(
        registered_shards(plain_model),
        torch_optimizer(optimizer),
        options=StateDictOptions(full_state_dict=True, cpu_offload=not everywhere),
    )
    if "param_groups" not in state:
        return state  # not the main process: nothing gathered here
    # Renumbered as optimizer.state_dict() numbers the parameters: 0, 1, ... through the groups in order.
    names = dict.fromkeys(name for group in state["param_groups"] for name in group["params"])
    state = send_to_device(state, "cpu") if everywhere else state
    return _rekeyed(state, {name: number for number, name in enumerate(names)})


def _rekeyed(state: dict[str, Any], key_of: Any) -> dict[str, Any]:
    """An optimizer state with each parameter's key (in ``state`` and in the parameter groups)
    replaced by ``key_of[key]``: from names to numbers, or back."""
    return {
        "state": {key_of[key]: value for key, value in state["state"].items()},
        "param_groups": [
            {**group, "params": [key_of[key] for key in group["params"]]} for group in state["param_groups"]
        ],
    }


def load_full_optimizer_state(plain_model: nn.Module, optimizer: Any, state: dict[str, Any]) -> None:
    """Load a plain optimizer's ``state_dict()`` (checked) into ``optimizer``; over sharded
    parameters (those of ``plain_model``) each process keeps its shards of it (every process
    must call this then)."""
    if not _holds_shards(optimizer):
        optimizer.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    model, inner = registered_shards(plain_model), torch_optimizer(optimizer)
    names_of = {id(parameter): name for name, parameter in model.named_parameters()}
    names = [names_of[id(parameter)] for group in inner.param_groups for parameter in group["params"]]
    set_optimizer_state_dict(
        model, inner, _rekeyed(state, names), options=StateDictOptions(full_state_dict=True)
    )
    # The groups' settings exactly as saved, as load_state_dict leaves them (torch's loader
    # turns tuples, such as AdamW's betas, into lists).
    for group, saved in zip(inner.param_groups, state["param_groups"], strict=True):
        group.update({key: value for key, value in saved.items() if key != "params"})


def load_full_model_state(model: nn.Module, state: dict[str, Any]) -> None:
    """Load a full (checked) state dict into ``model``; a sharded model keeps its shards of it
    (every process must call this then)."""
    if not is_sharded(model):
        model.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(registered_shards(model), state, options=StateDictOptions(full_state_dict=True))


# ---------------------------------------------------------------------------- shards in training states


def sharding_record(accelerator: Any) -> dict[str, Any] | None:
    """What the manifest records of a sharded state: the engine, FSDP version, the plugin's
    ``state_dict_type`` and the number of processes that saved it; None when the run is not
    sharded (not under accelerate's FSDP engine)."""
    if not uses_fsdp(accelerator):
        return None
    plugin = accelerator.state.fsdp_plugin
    return {
        "engine": "FSDP",
        "fsdp_version": int(plugin.fsdp_version),
        "state_dict_type": getattr(plugin.state_dict_type, "name", str(plugin.state_dict_type)),
        "num_processes": accelerator.num_processes,
    }


def describe(record: dict[str, Any]) -> str:
    return f"FSDP version {record['fsdp_version']} with state_dict_type={record['state_dict_type']}, on {record['num_processes']} process(es)"


def check_can_save(accelerator: Any, output_dir: Path, asynchronous: bool, saves_on_each_node: bool) -> None:
    """Refuse, before anything is written, a sharded save that cannot be done safely.

    Raises:
        ValueError: for ``asynchronous=True`` (DCP's collectives from a background thread could
            deadlock with the training loop's), or for saving on each node (every process's
            shards and DCP's metadata must land in one directory that every process sees).
    """
    if asynchronous:
        raise ValueError(
            f"Cannot save the training state {output_dir} asynchronously under FSDP: the sharded model and "
            f"optimizer are written by every process together (torch.distributed.checkpoint's collective "
            f"operations), which from a background thread could deadlock with the training loop's own. "
            f"Save it with asynchronous=False (SaveTrainingStateCallback(..., asynchronous=False))."
        )
    if saves_on_each_node and accelerator.num_processes > 1:
        raise ValueError(
            f"Cannot save the sharded (FSDP) training state {output_dir} with accelerate's save_on_each_node: "
            f"every process writes its shards into one directory, which needs a file system every process "
            f"sees. Turn save_on_each_node off and save to a shared file system."
        )


def save_model(accelerator: Any, model: nn.Module, directory: Path) -> None:
    """Write this process's shards of ``model`` into ``directory`` (every process must call this).

    Raises:
        torch_files.CheckpointWriteError: naming ``directory`` and the OS error, when there was one.
    """
    from accelerate.utils.fsdp_utils import save_fsdp_model

    with _write_errors(directory):
        save_fsdp_model(accelerator.state.fsdp_plugin, accelerator, model, str(directory))


def save_optimizer(accelerator: Any, optimizer: Any, model: nn.Module, directory: Path) -> None:
    """Write this process's shards of ``optimizer`` into ``directory`` (every process must call this)."""
    from accelerate.utils.fsdp_utils import save_fsdp_optimizer

    with _write_errors(directory):
        save_fsdp_optimizer(accelerator.state.fsdp_plugin, accelerator, optimizer, model, str(directory))


@contextlib.contextmanager
def _write_errors(directory: Path) -> Iterator[None]:
    """Raise a failed write as :func:`.torch_files.write_failure` says; when DCP reports it (its
    ``CheckpointException`` holds the exception of each process that failed, on every process),
    as a ``CheckpointWriteError`` naming those processes and the OS error."""
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException

    try:
        yield
    except (Exception, CheckpointException) as error:
        failures: dict[int, Any] = getattr(error, "failures", None) or {}
        for _, failure in sorted(failures.items()):
            os_error = torch_files.find_in_chain(
                failure[0] if isinstance(failure, tuple) else failure, OSError
            )
            if os_error is not None:
                reason = (os_error.strerror or str(os_error)) + (
                    f" (errno {os_error.errno})" if os_error.errno else ""
                )
                raise torch_files.CheckpointWriteError(
                    os_error.errno,
                    f"{reason} while process {', '.join(map(str, sorted(failures)))} wrote its shards into {directory}",
                    directory,
                ) from error
        raise torch_files.write_failure(error, directory) from error


def load(
    accelerator: Any, model: nn.Module, optimizer: Any, directory: Path, manifest: dict[str, Any]
) -> None:
    """Load the shards of a state checked by :func:`check_sharded_state` into ``model`` and
    ``optimizer`` (None, or a state saved without one: skipped); DCP reshards them when the
    number of processes changed. Every process must call this."""
    from accelerate.utils.fsdp_utils import load_fsdp_model, load_fsdp_optimizer

    load_fsdp_model(accelerator.state.fsdp_plugin, accelerator, model, str(directory))
    if optimizer is not None and any(
        str(name).startswith(OPTIMIZER_NAME) for name in manifest.get("files", ())
    ):
        load_fsdp_optimizer(accelerator.state.fsdp_plugin, accelerator, optimizer, model, str(directory))


def check_engine(directory: Path, saved: dict[str, Any], now: dict[str, Any] | None) -> None:
    """Raise :class:`ShardedStateError` when a state saved sharded (``saved``, from its
    manifest) cannot be loaded by a run sharded as ``now`` (None: not sharded)."""
    if now is None:
        full = saved["state_dict_type"] == "FULL_STATE_DICT"
        plain = (
            f"its {directory / 'pytorch_model_fsdp.bin'} holds the full model state dict (torch.load it)" if full else
            f"convert the model's shards with torch.distributed.checkpoint.format_utils.dcp_to_torch_save("
            f"{str(directory / 'pytorch_model_fsdp_0')!r}, ...)"
        )  # fmt: skip
        raise ShardedStateError(
            f"{directory} is a sharded training state: it was saved under FSDP ({describe(saved)}), each process "
            f"writing its own shards, and this Trainer does not use FSDP, so it cannot load them. Resume under the "
            f"same FSDP configuration (accelerate's FSDP plugin with fsdp_version={saved['fsdp_version']} and "
            f"state_dict_type={saved['state_dict_type']}). To get plain weights, call save_checkpoint under FSDP "
            f"(it writes the full state dict), or {plain}."
        )
    for key in ("fsdp_version", "state_dict_type"):
        if saved[key] != now[key]:
            raise ShardedStateError(
                f"{directory} was saved under FSDP with {key}={saved[key]!r}, but this run uses {key}={now[key]!r}: "
                f"its files are in that configuration's layout. Resume with the same FSDP configuration ({describe(saved)})."
            )
    if saved["state_dict_type"] == "LOCAL_STATE_DICT" and saved["num_processes"] != now["num_processes"]:
        raise ShardedStateError(
            f"{directory} was saved with state_dict_type=LOCAL_STATE_DICT by {saved['num_processes']} process(es), "
            f"and this run has {now['num_processes']}: local shards cannot be redistributed. Resume on "
            f"{saved['num_processes']} process(es), or save with SHARDED_STATE_DICT, which reshards."
        )


def check_sharded_state(
    directory: Path, manifest: dict[str, Any], model: nn.Module, optimizer: Any, ranks: tuple[int, int]
) -> None:
    """Check, before anything is loaded, every file of the sharded state ``directory`` that its
    manifest lists: present, its bytes as the CRC-32 in the manifest records (each ``.metadata``
    before it is read; the other shard files each by one process, ``ranks`` being this process's
    index and the number of processes; the ``.pt`` files where they are read), each DCP shard as
    long as its ``.metadata`` says, each ``.metadata`` holding only DCP's metadata, the model's
    keys and shapes, the optimizer's parameters.

    Raises:
        FileNotFoundError: a listed file is missing. torch_files.CheckpointFileError: a file's bytes
            changed. file_checks.UnusableStateError: a file is truncated or not DCP's.
            file_checks.StateMismatchError: the shards do not fit.
    """
    listed = [str(name) for name in manifest.get("files", ())]
    missing = [name for name in listed if not (directory / name).is_file()]
    if missing:
        raise FileNotFoundError(
            f"{directory} is missing {', '.join(missing)}: the state was changed after it was saved."
        )
    for name in listed:
        if Path(name).name == ".metadata":
            with torch_files.checked(directory / name, file_checksum(manifest, name)):
                metadata = read_dcp_metadata(directory / name)
            _check_shard_lengths(directory / Path(name).parent, metadata)
            _check_saved_keys(directory / Path(name).parent, metadata, model, optimizer)
    # Each shard file's bytes, by one process (the .metadata files were checked above, the .pt where read).
    for name in [shard for shard in listed if not shard.endswith((".pt", ".metadata"))][ranks[0] :: ranks[1]]:
        with torch_files.checked(directory / name, file_checksum(manifest, name)):
            pass
    full_model = directory / "pytorch_model_fsdp.bin"
    if full_model.is_file() and ranks[0] == 0:  # FULL_STATE_DICT: one file, loaded by process 0
        file_checks.check_model_state(
            model,
            torch_files.safe_torch_load(full_model, checksum=file_checksum(manifest, full_model.name)),
            str(full_model),
        )


#: The classes a DCP ``.metadata`` file may name; anything else is refused before DCP unpickles it.
_DCP_METADATA_MODULES = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem")
_OTHER_GLOBALS = {
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("collections", "OrderedDict"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if not (
            module in _DCP_METADATA_MODULES
            or (module, name) in _OTHER_GLOBALS
            or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype))
        ):
            raise pickle.UnpicklingError(
                f"it names {module}.{name}, which is not part of torch.distributed.checkpoint's metadata"
            )
        return super().find_class(module, name)


def read_dcp_metadata(path: Path) -> Any:
    """The DCP metadata in ``path``, read with an unpickler that admits only DCP's metadata
    classes (DCP itself unpickles the file without restriction).

    Raises:
        file_checks.UnusableStateError: naming the file, when it is damaged or names other objects.
    """
    try:
        with open(path, "rb") as file:
            metadata = _MetadataUnpickler(file).load()
    except pickle.UnpicklingError as error:
        raise file_checks.UnusableStateError(
            f"{path} is not torch.distributed.checkpoint's metadata: {error}. It was refused unread, since "
            f"unpickling it could run code; the state was changed after it was saved."
        ) from error
    except Exception as error:  # EOFError, ValueError, ...: cut short or damaged
        raise file_checks.UnusableStateError(
            f"{path} is truncated or corrupt ({type(error).__name__}: {error})."
        ) from error
    if not hasattr(metadata, "state_dict_metadata") or not hasattr(metadata, "storage_data"):
        raise file_checks.UnusableStateError(
            f"{path} holds a {type(metadata).__name__}, not torch.distributed.checkpoint's metadata."
        )
    return metadata


def _check_shard_lengths(directory: Path, metadata: Any) -> None:
    """Every shard file at least as long as the data the metadata places in it."""
    needed: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        needed[info.relative_path] = max(
            needed.get(info.relative_path, 0), int(info.offset) + int(info.length)
        )
    for name, length in sorted(needed.items()):
        path = directory / name
        if not path.is_file():
            raise FileNotFoundError(f"{directory} is missing the shard {name} that its .metadata lists.")
        if path.stat().st_size < length:
            raise file_checks.UnusableStateError(
                f"{path} is truncated or corrupt ({path.stat().st_size} bytes, the metadata places {length} bytes in it)."
            )


def _check_saved_keys(directory: Path, metadata: Any, model: nn.Module, optimizer: Any) -> None:
    """The saved model's keys and shapes fit ``model``; the saved optimizer state names only
    ``model``'s parameters, in as many parameter groups as ``optimizer`` has."""
    entries = metadata.state_dict_metadata
    if any(key.startswith("model.") for key in entries):
        file_checks.check_model_state(
            model,
            {
                key[len("model.") :]: torch.empty(tuple(value.size), device="meta")
                for key, value in entries.items()
                if key.startswith("model.")
            },
            str(directory),
        )
    if optimizer is None or not any(key.startswith("optimizer.") for key in entries):
        return
    saved = {
        key[len("optimizer.state.") :].rsplit(".", 1)[0]
        for key in entries
        if key.startswith("optimizer.state.")
    }
    groups = {key.split(".")[2] for key in entries if key.startswith("optimizer.param_groups.")}
    unknown = sorted(saved - {name for name, _ in model.named_parameters()})
    if unknown or len(groups) != len(optimizer.param_groups):
        raise file_checks.StateMismatchError(
            f"{directory} does not fit this optimizer: it holds {len(groups)} parameter group(s), the optimizer has "
            f"{len(optimizer.param_groups)}"
            + (f"; state for parameters the model does not have: {', '.join(unknown[:5])}" if unknown else "")
            + ". Was it saved with another model or optimizer?"
        )
