"""Training states written in a background thread: the state copied to host memory first (so the
loop may go on changing the originals), then written, and published once every process's files
are on disk. Knows nothing of the Trainer.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

from .directories import list_files, publish, temporary_dir_for, write_files, write_manifest
from .torch_files import CheckpointWriteError, write_failure


def to_host(value: Any, buffers: dict[tuple[int, str, int], Any]) -> Any:
    """A copy of ``value`` in host memory that training cannot change: every tensor copied to
    a new CPU tensor (tensors that shared a storage share the copy of it, as in ``torch.save``),
    dicts (an ``OrderedDict``'s ``_metadata`` too), lists and tuples copied; other values kept.

    ``buffers`` (host storages of an earlier copy, by the source storage they copied) are
    overwritten instead of allocating new memory where a source storage of the same address
    and size is met again (allocating is the slower half of a copy), and are replaced by this
    copy's storages. They must no longer be in use (the earlier copy written to disk).
    """
    storages: dict[tuple[int, str, int], Any] = {}
    copied = _to_host(value, storages, buffers)
    buffers.clear()
    buffers.update(storages)
    return copied


def _to_host(
    value: Any, storages: dict[tuple[int, str, int], Any], buffers: dict[tuple[int, str, int], Any]
) -> Any:
    if isinstance(value, torch.Tensor):
        return _copy_tensor(value.detach(), storages, buffers)
    if isinstance(value, OrderedDict):
        copied: Any = OrderedDict((key, _to_host(item, storages, buffers)) for key, item in value.items())
        if hasattr(value, "_metadata"):  # the module versions that load_state_dict reads
            copied._metadata = _to_host(value._metadata, storages, buffers)
        return copied
    if isinstance(value, dict):
        return {key: _to_host(item, storages, buffers) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        items = [_to_host(item, storages, buffers) for item in value]
        return items if isinstance(value, list) else tuple(items)
    return value


def _copy_tensor(
    tensor: torch.Tensor, storages: dict[tuple[int, str, int], Any], buffers: dict[tuple[int, str, int], Any]
) -> torch.Tensor:
    if tensor.layout != torch.strided or type(tensor) is not torch.Tensor:  # sparse, subclasses: copied alone
        return tensor.to("cpu", copy=True)
    storage = tensor.untyped_storage()
    key = (storage.data_ptr(), str(storage.device), storage.nbytes())
    if key not in storages:
        buffer = buffers.get(key)
        storages[key] = (
            buffer.copy_(storage)
            if buffer is not None
            else storage.clone()
            if storage.device.type == "cpu"
            else storage.cpu()
        )
    return torch.empty(0, dtype=tensor.dtype).set_(
        storages[key], tensor.storage_offset(), tensor.size(), tensor.stride()
    )


class BackgroundStateWrite:
    """One process's part of a training state written in a background thread.

    Every process writes its files (``contents``, copies in host memory, see :func:`to_host`)
    into the hidden directory of ``output_dir``, which must exist. The publishing process (the
    one given the ``manifest``) then waits until every other process has marked its files as
    written and flushed (a ``.done_<rank>`` file; ``.failed_<rank>`` holds a failure), for at
    most ``timeout_s`` seconds, and only then writes the manifest and publishes the state (see
    :func:`publish`). A process killed meanwhile leaves the hidden directory, never a state that
    looks complete. :meth:`wait` returns the error of the write, if any; the thread never raises.
    """

    def __init__(
        self,
        output_dir: Path,
        contents: dict[str, Any],
        rank: int,
        num_processes: int,
        manifest: dict[str, Any] | None,
        timeout_s: float,
    ) -> None:
        self.output_dir, self.temporary = output_dir, temporary_dir_for(output_dir)
        self.error: BaseException | None = None
        self._contents, self._rank, self._manifest = contents, rank, manifest
        self._others = [other for other in range(num_processes) if other != rank]
        self._timeout_s = timeout_s
        self._deadline = time.monotonic() + timeout_s
        self._thread = threading.Thread(target=self._run, name=f"save {output_dir.name}", daemon=False)
        atexit.register(self._report_unwaited)  # until wait() is called
        self._thread.start()

    def _run(self) -> None:
        try:
            write_files(self.temporary, self._contents)
            self._contents = {}  # free the copies as soon as they are on disk
            if self._manifest is None:
                _mark(self.temporary / f".done_{self._rank}", "")
                return
            self._wait_for_other_processes()
            write_manifest(self.temporary, {**self._manifest, "files": list_files(self.temporary)})
            publish(self.temporary, self.output_dir)
        except BaseException as error:  # kept for wait(), which raises it in the training thread
            self.error = write_failure(error, self.temporary)
            if self._manifest is None:
                _mark(self.temporary / f".failed_{self._rank}", str(self.error))
        finally:
            self._contents = {}

    def _wait_for_other_processes(self) -> None:
        waiting = set(self._others)
        while waiting:
            for rank in sorted(waiting):
                failed = self.temporary / f".failed_{rank}"
                if failed.exists():
                    raise CheckpointWriteError(
                        None,
                        f"process {rank} could not write its files ({failed.read_text()})",
                        self.output_dir,
                    )
                if (self.temporary / f".done_{rank}").exists():
                    waiting.discard(rank)
            if waiting and time.monotonic() > self._deadline:
                raise CheckpointWriteError(
                    None,
                    f"process {', '.join(map(str, sorted(waiting)))} did not finish writing its files "
                    f"within {self._timeout_s:g} s (did it stop?), so the state was not published",
                    self.output_dir,
                )
            time.sleep(0.01)
        for rank in self._others:
            (self.temporary / f".done_{rank}").unlink(missing_ok=True)

    def wait(self, grace_s: float | None = None) -> BaseException | None:
        """Wait for the write to end; return its error, or None once it is published (or, on a
        process that does not publish, once its files are written). ``grace_s`` shortens the
        wait for the other processes (when one of them may have failed)."""
        if grace_s is not None:
            self._deadline = min(self._deadline, time.monotonic() + grace_s)
        self._thread.join()
        atexit.unregister(self._report_unwaited)
        return self.error

    def _report_unwaited(self) -> None:
        """At interpreter exit (after its threads have ended), when nobody waited for this write:
        say if it failed."""
        if (error := self.wait()) is not None:
            print(
                f"pytorch_accelerated: the training state {self.output_dir}, written in the background, "
                f"could not be saved: {error}",
                file=sys.stderr,
            )


def _mark(path: Path, text: str) -> None:
    """Create the marker ``path`` holding ``text`` in one step (written aside, then renamed)."""
    aside = path.with_name(path.name + ".tmp")
    # On failure, the publisher waits until its timeout, and says which process did not finish.
    with contextlib.suppress(OSError):
        aside.write_text(text)
        os.replace(aside, path)
