r"""Where a result was measured: the facts every benchmark and experiment file records.

Timings on shared machines are only comparable when the machine, the thread count
and the load are known, so every results file carries :func:`machine_info`.
"""

from __future__ import annotations

import os
import platform
import re
import statistics
import time
from collections.abc import Callable
from typing import Any

import botorch
import gpytorch
import torch


def machine_info(device: str | torch.device = "cpu", **extra: Any) -> dict[str, Any]:
    r"""Platform, CPU count, torch threads, load average and library versions.

    Args:
        device: The device the measurement ran on (its name is recorded; for CUDA
            also the GPU model).
        extra: Further entries (e.g. ``dtype``), added as given.

    Example:
        >>> info = machine_info(dtype="float64")
        >>> sorted(info)[:3]
        ['botorch', 'cpu_count', 'device']
    """
    device = torch.device(device)
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average": os.getloadavg(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "gpytorch": gpytorch.__version__,
        "botorch": botorch.__version__,
        "device": str(device),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    info.update(extra)
    return info


def device_label(info: dict[str, Any]) -> str:
    r"""A file-name-safe name of the device a :func:`machine_info` describes: the GPU model
    on CUDA (``"nvidia-h200"``), else the device (``"cpu"``). GPU results files carry it.

    Example:
        >>> device_label({"device": "cuda:0", "gpu": "NVIDIA H200"})
        'nvidia-h200'
    """
    return re.sub(r"[^a-z0-9]+", "-", info.get("gpu", info["device"]).lower()).strip("-")


def synchronize() -> None:
    r"""Wait for the work queued on the CUDA devices, if CUDA is in use (else nothing).

    CUDA runs kernels asynchronously: a timer read without this measures the launches,
    not the work.

    Example:
        >>> synchronize()  # on a CPU-only machine: nothing to wait for
    """
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def median_seconds(fn: Callable[[], Any], repeats: int = 3, warmup: bool = False) -> float:
    r"""Median wall-clock seconds of ``repeats`` calls of ``fn`` (after one untimed call
    with ``warmup``); the median, because shared machines have noisy tails. Each call is
    timed to the end of its device work (:func:`synchronize`).

    Example:
        >>> median_seconds(lambda: sum(range(1000)), repeats=3) >= 0.0
        True
    """
    if warmup:
        fn()
    times = []
    for _ in range(repeats):
        synchronize()
        start = time.perf_counter()
        fn()
        synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)
