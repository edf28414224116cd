r"""Machinery shared by the loops: private RNG streams, timing, history, checkpoints.

Each loop draws all of its randomness (initial design, objective noise, BoTorch's
raw samples and MC base samples) from its own RNG state, restored before and
saved after every step. Runs are therefore reproducible from a seed, do not
disturb the caller's global RNG, and a run resumed from a checkpoint continues
exactly as the uninterrupted run would.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from streamgp.utils.checkpoint_files import read_checkpoint_file, write_checkpoint_file


def resolve_device(device: str | torch.device) -> torch.device:
    r"""``torch.device`` for ``device``, with a clear error when CUDA is unavailable."""
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was requested but torch.cuda.is_available() is False.")
    return device


class Stopwatch:
    r"""Accumulates wall-clock seconds per named phase (synchronising CUDA)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str):
        self._sync()
        start = time.perf_counter()
        try:
            yield
        finally:
            self._sync()
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - start

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


class Loop(ABC):
    r"""Base class of the loops: seeded steps, a history, checkpoints, ``run``.

    Subclasses implement :meth:`_initialize` (the initial design, recorded as step
    0), :meth:`_step` (one iteration, returning the history record) and the
    ``_state``/``_load_state`` pair for what they need to resume.

    Args:
        seed: Seed of the loop's private RNG stream.
        device: ``"cpu"`` or ``"cuda"``.
        dtype: Floating dtype of all tensors.
    """

    def __init__(
        self, *, seed: int = 0, device: str | torch.device = "cpu", dtype=torch.float64
    ) -> None:
        self.device = resolve_device(device)
        self.tkwargs = {"device": self.device, "dtype": dtype}
        self.seed = int(seed)
        with torch.random.fork_rng(devices=self._rng_devices()):
            torch.manual_seed(self.seed)
            self._rng_state = self._get_rng()
        self.history: list[dict[str, Any]] = []
        self.initialized = False

    # ------------------------------------------------------------------ RNG
    def _rng_devices(self) -> list[int]:
        return [self.device.index or 0] if self.device.type == "cuda" else []

    def _get_rng(self) -> dict[str, Any]:
        state = {"cpu": torch.get_rng_state()}
        if self.device.type == "cuda":
            state["cuda"] = torch.cuda.get_rng_state(self.device)
        return state

    @contextmanager
    def _private_rng(self):
        with torch.random.fork_rng(devices=self._rng_devices()):
            torch.set_rng_state(self._rng_state["cpu"])
            if "cuda" in self._rng_state:
                torch.cuda.set_rng_state(self._rng_state["cuda"], self.device)
            yield
            self._rng_state = self._get_rng()

    # ------------------------------------------------------------------ steps
    @abstractmethod
    def _initialize(self, watch: Stopwatch) -> dict[str, Any]:
        r"""Evaluate the initial design and build the model; return the step-0 record."""

    @abstractmethod
    def _step(self, watch: Stopwatch) -> dict[str, Any]:
        r"""One iteration; return its record (timings are added by :meth:`step`)."""

    def step(self) -> dict[str, Any]:
        r"""Run one iteration (the initial design first) and append its record."""
        watch = Stopwatch(self.device)
        with self._private_rng():
            record = self._step(watch) if self.initialized else self._initialize(watch)
        self.initialized = True
        record = {"step": len(self.history), **record}
        for phase in self.PHASES:
            record[f"{phase}_time"] = watch.seconds.get(phase, 0.0)
        record["step_time"] = sum(watch.seconds.values())
        previous = self.history[-1]["cumulative_time"] if self.history else 0.0
        record["cumulative_time"] = previous + record["step_time"]
        self.history.append(record)
        return record

    #: Timed phases of a step (columns ``<phase>_time`` of the history).
    PHASES: tuple[str, ...] = ("fit", "acquisition", "update")

    def run(
        self,
        num_steps: int,
        *,
        checkpoint: str | Path | None = None,
        checkpoint_every: int = 10,
        progress: bool = False,
    ) -> pd.DataFrame:
        r"""Run until ``num_steps`` iterations after the initial design are recorded.

        Args:
            num_steps: Total number of iterations (a resumed loop runs only the rest).
            checkpoint: Optional file to save the loop to every ``checkpoint_every``
                steps and at the end.
            checkpoint_every: Steps between checkpoints.
            progress: Show a tqdm progress bar.

        Returns:
            The history as a DataFrame (one row per step, step 0 the initial design).
        """
        if num_steps < 0:
            raise ValueError(f"num_steps must be >= 0, got {num_steps}.")
        if checkpoint_every < 1:
            raise ValueError(f"checkpoint_every must be >= 1, got {checkpoint_every}.")
        remaining = num_steps + 1 - len(self.history)
        bar = None
        if progress and remaining > 0:
            from tqdm.auto import tqdm

            bar = tqdm(total=num_steps + 1, initial=len(self.history), desc=self.describe())
        for _ in range(max(remaining, 0)):
            record = self.step()
            if bar is not None:
                bar.update(1)
                bar.set_postfix(self.progress_fields(record), refresh=False)
            if checkpoint is not None and record["step"] % checkpoint_every == 0:
                self.save(checkpoint)
        if bar is not None:
            bar.close()
        if checkpoint is not None:
            self.save(checkpoint)
        return self.results()

    def results(self) -> pd.DataFrame:
        r"""The history as a DataFrame."""
        return pd.DataFrame(self.history)

    def describe(self) -> str:
        return type(self).__name__

    def progress_fields(self, record: dict[str, Any]) -> dict[str, Any]:
        return {"n": record.get("num_observations")}

    # ------------------------------------------------------------------ checkpoints
    @abstractmethod
    def _state(self) -> dict[str, Any]:
        r"""Subclass state to checkpoint (tensors, surrogate state)."""

    @abstractmethod
    def _load_state(self, state: dict[str, Any]) -> None:
        r"""Restore :meth:`_state` (the loop was constructed with the same settings)."""

    def config(self) -> dict[str, Any]:
        r"""Constructor settings stored in checkpoints and checked on resume."""
        return {"seed": self.seed, "dtype": str(self.tkwargs["dtype"])}

    def save(self, path: str | Path) -> None:
        r"""Write a checkpoint (atomically: a crash never leaves a truncated file)."""
        # Tensors and plain types only: ``load`` reads it with ``weights_only=True``, so a
        # checkpoint file can never run code when a run is resumed.
        payload = {
            "config": self.config(),
            "history": self.history,
            "rng": self._rng_state,
            "initialized": self.initialized,
            "state": self._state() if self.initialized else None,
        }
        write_checkpoint_file(payload, path)

    def load(self, path: str | Path) -> Loop:
        r"""Resume from a checkpoint written by a loop built with the same settings."""
        payload = read_checkpoint_file(path, "a streamgp loop checkpoint", self.device)
        if not isinstance(payload, dict) or not {"config", "history", "rng"} <= set(payload):
            raise ValueError(f"checkpoint {str(path)!r} is not a streamgp loop checkpoint.")
        if payload["config"] != self.config():
            raise ValueError(
                f"checkpoint {str(path)!r} was written with settings {payload['config']}, "
                f"which differ from this loop's {self.config()}."
            )
        self._rng_state = {key: value.cpu() for key, value in payload["rng"].items()}
        self.history = payload["history"]
        self.initialized = payload["initialized"]
        if self.initialized:
            self._load_state(payload["state"])
        return self
