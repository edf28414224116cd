r"""Checkpoint files: written atomically, read as tensors and plain types only.

Every checkpoint file streamgp writes (a model's :meth:`save_checkpoint
<streamgp.models.base.CheckpointMixin.save_checkpoint>`, a loop's ``save``) goes through
:func:`write_checkpoint_file`, and every one it reads through
:func:`read_checkpoint_file`:

- writing goes to a temporary file beside the target, flushed to disk, then renamed over
  it, so a crash mid-write leaves the previous file (or none), never a truncated one;
- reading uses ``torch.load(..., weights_only=True)``: tensors, numbers, strings and
  containers of them. A file holding any other pickled object is refused, so a tampered
  checkpoint cannot run code when it is loaded; a truncated or corrupted file gives a
  ``ValueError`` naming the path instead of a deep zip or unpickling error.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch


def write_checkpoint_file(payload: Any, path: str | Path) -> Path:
    r"""Write ``payload`` with ``torch.save`` to ``path`` atomically; returns the path.

    Example:
        >>> import tempfile, torch
        >>> folder = tempfile.mkdtemp()
        >>> path = write_checkpoint_file({"w": torch.ones(2)}, f"{folder}/state.pt")
        >>> read_checkpoint_file(path)["w"]
        tensor([1., 1.])
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as file:
            torch.save(payload, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def read_checkpoint_file(
    path: str | Path, what: str = "a streamgp checkpoint", map_location: Any = None
) -> Any:
    r"""Read a file written by :func:`write_checkpoint_file` (``weights_only=True``).

    Args:
        path: The file.
        what: What the file should hold, for the error message.
        map_location: As ``torch.load``'s (e.g. the device to load onto).

    Raises:
        FileNotFoundError: If there is no such file.
        ValueError: Naming the path, if the file is truncated, corrupted or holds
            anything but tensors and plain types.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint file {str(path)!r} does not exist.")
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as error:  # truncated, corrupted, or holding pickled objects
        raise ValueError(
            f"checkpoint file {str(path)!r} cannot be read as {what} (a file written by "
            f"streamgp holds tensors and plain types only): {type(error).__name__}: "
            f"{str(error).splitlines()[0] if str(error) else ''}"
        ) from error
