"""Torch file I/O, for every file a checkpoint or training state holds: safe values in, atomic
writes, safe loading.

Knows nothing of the Trainer or callbacks. Files are loaded with ``torch.load(...,
weights_only=True)``, which never runs code from the file; to make that possible, values that
only plain pickle could restore are converted when saving (numpy scalars to Python numbers,
numpy arrays to tensors, paths to strings), and anything else unsafe is refused before a byte
is written.

Failures say what happened to which file. A write that fails (disk full, a file-size limit, a
parent that is a file) raises :class:`CheckpointWriteError` naming the file and the OS error,
after removing what it had written; an interrupt is re-raised as ``KeyboardInterrupt``, never
as torch's ``unexpected pos`` error. A file that cannot be loaded raises
:class:`CheckpointFileError` saying what is wrong with it (empty, truncated, of another
format); only a complete torch file refused for holding objects beyond tensors and plain data
gets the advice (and the warning) about ``weights_only=False``.

Every file is checked against the CRC-32 recorded when it was saved, where there is one (a training
state's manifest; ``<file>.crc32`` beside a single-file checkpoint): a file whose bytes changed
raises :class:`CheckpointFileError` naming it, and nothing it holds is returned.
"""

from __future__ import annotations

import contextlib
import errno
import json
import mmap
import os
import pickle
import pickletools
import re
import signal
import tempfile
import threading
import zipfile
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any, TypeVar

import torch

_SAFE_SCALARS = (str, bytes, int, float, bool, complex, type(None))


def to_safe_value(value: Any, where: str = "checkpoint_kwargs") -> Any:
    """Convert ``value`` to something ``torch.load(weights_only=True)`` can read back.

    Raises:
        TypeError: for values that have no safe equivalent, naming where they were found.
    """
    # Before the scalar check: np.float64 and np.str_ subclass float and str, but pickle as numpy.
    if type(value).__module__ == "numpy":
        import numpy as np

        if isinstance(value, np.ndarray):
            return torch.from_numpy(np.ascontiguousarray(value))
        if isinstance(value, np.generic):
            return value.item()
    if isinstance(value, (*_SAFE_SCALARS, torch.Tensor, torch.dtype, torch.device, torch.Size)):
        return value
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, Mapping):
        return {key: to_safe_value(item, f"{where}[{key!r}]") for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        converted = [to_safe_value(item, f"{where}[{index}]") for index, item in enumerate(value)]
        return converted if isinstance(value, list) else tuple(converted)
    raise TypeError(
        f"{where} holds a {type(value).__module__}.{type(value).__qualname__}, which cannot be "
        f"loaded back safely (checkpoints load with weights_only=True, which never runs code "
        f"from the file). Convert it to a tensor, number, string, list or dict before saving."
    )


# ---------------------------------------------------------------------------- writing

_E = TypeVar("_E", bound=BaseException)


class CheckpointWriteError(OSError):
    """A checkpoint or training state could not be written; what was written has been removed.

    ``errno`` is that of the OS error behind it (None when there was none) and ``filename``
    the checkpoint file or state directory that was being saved.
    """

    def __init__(self, error_number: int | None, message: str, target: str | os.PathLike) -> None:
        super().__init__(error_number, message, str(target))
        self.message = message

    def __str__(self) -> str:
        return self.message


def find_in_chain(error: BaseException, kind: type[_E]) -> _E | None:
    """The first exception of type ``kind`` in ``error``'s chain (itself, its cause, its context).

    Torch reports an OS error during ``torch.save`` (or an interrupt) as a ``RuntimeError``
    (``unexpected pos ...``) with the real exception only as its context.
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, kind):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def write_failure(error: BaseException, path: Path, doing: str = "writing") -> BaseException:
    """What to raise for ``error`` met while ``doing`` ``path``: the interrupt if there was one,
    a :class:`CheckpointWriteError` naming ``path`` and the OS error behind it if there was
    one, else ``error`` itself."""
    if (interrupt := find_in_chain(error, KeyboardInterrupt)) is not None:
        return interrupt
    os_error = find_in_chain(error, OSError)
    # Said already; or not a failure of the file system (e.g. an object that cannot be pickled).
    if isinstance(error, CheckpointWriteError) or os_error is None:
        return error
    reason = (os_error.strerror or str(os_error)) + (
        f" (errno {os_error.errno})" if os_error.errno is not None else ""
    )
    where = os_error.filename if doing != "writing" and os_error.filename else path
    return CheckpointWriteError(os_error.errno, f"{reason} while {doing} {where}", path)


def write_hint(error: CheckpointWriteError, target: Path) -> str:
    """How to fix the failed save of ``target``, from the OS error behind ``error``."""
    # The nearest existing parent: a file there blocks the folders below it.
    if (
        blocker := next((parent for parent in target.parents if parent.exists()), None)
    ) and not blocker.is_dir():
        return f"{blocker} is a file, not a folder: choose another path."
    if error.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return "Free space (or raise the file-size limit) or choose another folder."
    if error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return "Make the folder writable or choose another one."
    return "Check the path and the file system."


def write_torch_file(obj: Any, path: Path) -> None:
    """``torch.save`` to ``path``, flushed to disk; a failure raises what :func:`write_failure` says.

    A SIGINT (Ctrl-C) during the write is held back until ``torch.save`` returns and then
    raised as ``KeyboardInterrupt``: raised inside torch's writer, it would surface as an
    ``unexpected pos`` error, or abort the process when the half-written archive is freed.
    """
    try:
        with open(path, "wb") as file, _interrupts_held_back():
            torch.save(obj, file)
            file.flush()
            os.fsync(file.fileno())
    except BaseException as error:
        failure = write_failure(error, path)
        if failure is error:
            raise
        raise failure from error


@contextlib.contextmanager
def _interrupts_held_back() -> Iterator[None]:
    """Hold back SIGINT's KeyboardInterrupt until the block ends (main thread, default handler only)."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return
    received: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if received:
            raise KeyboardInterrupt


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> None:
    """Write ``obj`` to ``path`` so that ``path`` is either the old file or the complete new one.

    Raises:
        CheckpointWriteError: naming ``path`` and the OS error, once the temporary file is removed.
        KeyboardInterrupt: when interrupted (the temporary file is removed too).
    """
    path = Path(path)
    tmp_name: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        write_torch_file(obj, Path(tmp_name))
        # mkstemp creates the file readable by its owner only; give it the usual permissions.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp_name, 0o666 & ~umask)
        with open(f"{tmp_name}.crc32", "w") as file:
            file.write(f"{file_crc32(Path(tmp_name)):08x}\n")
            file.flush()
            os.fsync(file.fileno())
        # Killed between the renames, the new file has no checksum (loaded unchecked), never an old one.
        checksum_file(path).unlink(missing_ok=True)
        os.replace(tmp_name, path)
        os.replace(f"{tmp_name}.crc32", checksum_file(path))
    except BaseException as error:
        if tmp_name is not None:
            Path(tmp_name).unlink(missing_ok=True)
            Path(f"{tmp_name}.crc32").unlink(missing_ok=True)
        failure = write_failure(error, Path(tmp_name or path.parent), "writing" if tmp_name else "creating")
        if failure is error and not isinstance(error, CheckpointWriteError):
            raise
        if not isinstance(failure, CheckpointWriteError):
            raise failure from error
        kept = f"{path} is unchanged" if path.is_file() else "no file was created"
        raise CheckpointWriteError(
            failure.errno,
            f"Could not save the checkpoint to {path}: {failure.message}. Nothing was written; {kept}. "
            f"{write_hint(failure, path)}",
            path,
        ) from error


# ---------------------------------------------------------------------------- checksums


def file_crc32(path: Path) -> int:
    """The CRC-32 of the bytes of ``path``, read through a memory map (the page cache, not a copy:
    memory stays bounded, and it costs less CPU than reading into a buffer)."""
    with open(path, "rb") as file:
        if os.fstat(file.fileno()).st_size == 0:
            return zlib.crc32(b"")
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            if hasattr(mmap, "MADV_SEQUENTIAL"):  # not on Windows
                mapped.madvise(mmap.MADV_SEQUENTIAL)
            return zlib.crc32(mapped)


def checksum_file(path: Path) -> Path:
    """Where :func:`atomic_torch_save` records the CRC-32 of ``path``: ``<path>.crc32`` beside it."""
    return path.with_name(f"{path.name}.crc32")


@dataclass(frozen=True)
class Checksum:
    """The CRC-32 a file had when it was saved, where that is recorded, and what to do when the
    file no longer has it."""

    crc32: int
    recorded_in: str
    fix: str


def recorded_checksum(path: str | os.PathLike, fix: str) -> Checksum | None:
    """The checksum that :func:`atomic_torch_save` wrote beside ``path`` (None: none there, e.g. a
    file written by an older version or by ``torch.save``)."""
    sidecar = checksum_file(Path(path))
    if not (Path(path).is_file() and sidecar.is_file()):  # no file: safe_torch_load says what it is
        return None
    text = sidecar.read_bytes()
    # A damaged checksum file (-1) is reported as a mismatch that names it.
    return Checksum(int(text, 16) if re.fullmatch(rb"[0-9a-f]{8}\n", text) else -1, str(sidecar), fix)


@contextlib.contextmanager
def checked(path: Path, checksum: Checksum | None) -> Iterator[None]:
    """Compute the CRC-32 of ``path``, in a second thread while the block reads the file, and raise
    :class:`CheckpointFileError` naming the file at the end of the block if it differs from
    ``checksum`` (None: nothing to check); the block's result is then never used, and an error
    the block raised on the damaged bytes is replaced by this one."""
    if checksum is None:
        yield
        return
    found: list[int | BaseException] = []

    def compute() -> None:
        try:
            found.append(file_crc32(path))
        except BaseException as error:
            found.append(error)

    thread = threading.Thread(target=compute, name=f"checksum {path.name}", daemon=True)
    thread.start()
    try:
        yield
    except Exception:
        thread.join()
        if found[0] == checksum.crc32:
            raise
        raise _damaged(path, checksum, found[0]) from None
    thread.join()
    if found[0] != checksum.crc32:
        raise _damaged(path, checksum, found[0])


def _damaged(path: Path, checksum: Checksum, found: int | BaseException) -> CheckpointFileError:
    now = f"CRC-32 {found:08x}" if isinstance(found, int) else f"it could not be read: {found}"
    recorded = f"{checksum.crc32:08x}" if checksum.crc32 >= 0 else "an unreadable value"
    return CheckpointFileError(
        f"{path} is damaged: its bytes changed after it was saved ({now}; {checksum.recorded_in} records "
        f"{recorded}). Nothing was loaded. {checksum.fix}"
    )


# ---------------------------------------------------------------------------- loading


class CheckpointFileError(ValueError):
    """A file that is not a complete checkpoint written by ``torch.save``: empty, truncated,
    corrupt, or of another format. The message names the file and what is wrong with it."""


_TRUNCATED = "is truncated or corrupt (not a complete torch checkpoint)"
_LEGACY_MAGIC = b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19."  # torch's pre-1.6 format begins so
_CODE_OPCODES = {"GLOBAL", "STACK_GLOBAL", "INST", "OBJ", "REDUCE", "BUILD", "NEWOBJ", "NEWOBJ_EX"}


def safe_torch_load(
    path: str | os.PathLike, checksum: Checksum | None = None, map_location: Any = "cpu"
) -> Any:
    """Load a file written by :func:`atomic_torch_save` without running code from it, checked
    against ``checksum`` (see :func:`checked`) when one is given.

    Raises:
        FileNotFoundError: no such file. IsADirectoryError: ``path`` is a directory.
        CheckpointFileError: the file is empty, truncated, corrupt or of another format, or its
            bytes differ from ``checksum``.
        pickle.UnpicklingError: a complete torch file holding objects beyond tensors and plain
            data, which ``weights_only=True`` refuses (the message says why loading it
            otherwise is dangerous).
    """
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(
            f"{path} is a directory, not a checkpoint file (to load a training state directory, use "
            f"load_training_state or train(resume_from=...))."
        )
    if not path.is_file():
        raise FileNotFoundError(f"No checkpoint file at {str(path)!r}.")
    if path.stat().st_size == 0:
        raise CheckpointFileError(f"{path} is empty (0 bytes). {_BAD_FILE_HINT}")
    with checked(path, checksum):
        try:
            return torch.load(path, map_location=map_location, weights_only=True)
        except Exception as error:
            failure = _load_failure(path, error)
        # Raised here, outside the handler, so that torch's error (whose advice is to load with
        # weights_only=False) is neither the cause nor the context: its reason is in the message.
        raise failure


def _load_failure(path: Path, error: Exception) -> Exception:
    problem = describe_bad_file(path)
    if problem is not None:
        hint = _OTHER_FORMAT_HINT if problem.startswith(("is not", "is a zip")) else _BAD_FILE_HINT
        return CheckpointFileError(f"{path} {problem}. {hint}")
    if isinstance(error, pickle.UnpicklingError) and _refused_for_code(path, error):
        return pickle.UnpicklingError(
            f"Refused to load {str(path)!r}: it holds objects beyond tensors and plain data "
            f"({torch_load_reason(error)}), and checkpoints are only loaded with weights_only=True. Unpickling "
            f"such a file can run arbitrary code: load it with torch.load(..., weights_only=False) only if "
            f"you created it yourself or fully trust where it came from."
        )
    return CheckpointFileError(f"{path} could not be loaded: {torch_load_reason(error)}. {_BAD_FILE_HINT}")


_BAD_FILE_HINT = (
    "Its save may have been interrupted, or the file damaged: use another checkpoint, or save it again."
)
_OTHER_FORMAT_HINT = "Check the path: pass a file written by save_checkpoint (or torch.save)."


def describe_bad_file(path: Path) -> str | None:
    """What is wrong with the structure of ``path`` as a torch file, or None if it looks whole.

    Reads the file without unpickling it (only parsing the pickle's opcodes).
    """
    with open(path, "rb") as file:
        head = file.read(4096)
    if zipfile.is_zipfile(path):
        return _describe_bad_zip(path)
    if head.startswith(b"PK"):
        return _TRUNCATED
    if head.startswith(_LEGACY_MAGIC):
        return None if _legacy_pickle(path) is not None else _TRUNCATED
    return f"is not a file written by torch.save ({_other_format(head)})"


def _describe_bad_zip(path: Path) -> str | None:
    try:
        with zipfile.ZipFile(path) as archive:
            records = [
                name for name in archive.namelist() if name.count("/") == 1 and name.endswith("/data.pkl")
            ]
            if not records:
                return "is a zip archive, not a file written by torch.save (it holds no data.pkl)"
            list(pickletools.genops(archive.read(records[0])))
            damaged = archive.testzip()
    except (zipfile.BadZipFile, ValueError, EOFError, OSError):
        return _TRUNCATED
    return f"{_TRUNCATED}: its record {damaged} fails its checksum" if damaged else None


def _legacy_pickle(path: Path) -> bytes | None:
    """The pickle of the saved object in a pre-1.6 torch file (its 4th), or None if malformed."""
    with open(path, "rb") as file:
        try:
            for _ in range(3):  # the magic number, the protocol version, the system information
                list(pickletools.genops(file))
            begin = file.tell()
            list(pickletools.genops(file))
        except (ValueError, EOFError):
            return None
        end = file.tell()
        file.seek(begin)
        return file.read(end - begin)


def _other_format(head: bytes) -> str:
    if head.startswith(b"\x93NUMPY"):
        return "it is a numpy .npy file; load it with numpy.load"
    if head[:1] == b"\x80":
        return "it is a plain pickle file, not a torch checkpoint"
    with contextlib.suppress(UnicodeDecodeError):
        text = head.decode("utf-8").strip()
        if text[:1] in ("{", "["):
            with contextlib.suppress(ValueError):
                json.loads(text)
                return "it is a JSON file"
        if all(char.isprintable() or char in "\n\r\t" for char in text):
            return "it is a text file"
    return "its contents are not those of any known format"


def _refused_for_code(path: Path, error: pickle.UnpicklingError) -> bool:
    """True when torch refused a complete file because its pickle names globals (not corruption)."""
    if "GLOBAL" not in str(error):
        return False
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            data = archive.read(next(name for name in archive.namelist() if name.endswith("/data.pkl")))
    else:
        data = _legacy_pickle(path) or b""
    return any(opcode.name in _CODE_OPCODES for opcode, _, _ in pickletools.genops(data))


def torch_load_reason(error: BaseException) -> str:
    """Torch's own reason for a failed load, without its generic advice about weights_only."""
    reasons = [
        part
        for part in map(str.strip, str(error).split("\n\n"))
        if part and "weights_only" not in part and not part.startswith("Check the documentation")
    ]
    return " ".join(" ".join(reasons).split()).rstrip(".") or type(error).__name__
