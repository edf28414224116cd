r"""Captured CUDA graphs of fixed-shape tensor functions, replayed instead of re-launched.

On a GPU a WISKI prediction is bound by kernel launches, not arithmetic: a few dozen
small kernels whose launch overhead exceeds their run time. A CUDA graph records
such a sequence once and replays it with one launch [NVIDIA2024]_. :class:`GraphCache`
keeps the graphs of one function by the shape, dtype and device of its input (and by
a key naming the cached tensors the function reads, so a graph never replays against
stale caches), captures on first use and replays after.

What a replay does and does not do:

- The captured function must be pure tensor work without host synchronisation (no
  value checks, no ``.item()``); its caller runs those before.
- Outputs are copied out of the graph's static buffers, so a later replay never
  overwrites a result the caller holds.
- With an input that requires grad, the graph is captured with
  :func:`torch.cuda.make_graphed_callables` and differentiates with respect to that
  input only (gradients for tensors the function closes over, such as
  hyperparameters, are not propagated: a caller captures under
  :func:`without_parameter_grads`); each forward's backward must run before the
  next forward of the same graph, as in an acquisition optimiser's loop.

References:

.. [NVIDIA2024] NVIDIA. CUDA C++ Programming Guide, section "CUDA Graphs", 2024.
"""

from __future__ import annotations

import contextlib
import warnings
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import Any

import torch
from torch import Tensor

__all__ = ["CudaGraphWarning", "GraphCache", "without_parameter_grads"]

#: Graphs kept per cache (least recently used dropped first): each holds a private
#: memory pool for its intermediates.
MAX_GRAPHS = 8
#: Eager calls on a side stream before capture (lazily built constants are made there,
#: and cuBLAS picks its workspaces).
WARMUP_CALLS = 2


@contextlib.contextmanager
def without_parameter_grads(module: torch.nn.Module) -> Iterator[None]:
    r"""Run with ``module``'s parameters not requiring grad (restored after).

    What a graph captures inside it differentiates with respect to its input alone,
    and no gradient node of a parameter is made on the capture's side stream (a later
    backward into that parameter on another stream would synchronise and warn).

    Example:
        >>> layer = torch.nn.Linear(2, 1)
        >>> with without_parameter_grads(layer):
        ...     layer(torch.ones(2)).requires_grad
        False
        >>> layer.weight.requires_grad
        True
    """
    frozen = [p for p in module.parameters() if p.requires_grad]
    for parameter in frozen:
        parameter.requires_grad_(False)
    try:
        yield
    finally:
        for parameter in frozen:
            parameter.requires_grad_(True)


class CudaGraphWarning(RuntimeWarning):
    r"""A CUDA graph could not be captured; the computation runs eagerly instead."""


class _Graphed:
    r"""One captured graph of ``fn`` at one input shape, replayed by :meth:`__call__`."""

    def __init__(self, fn: Callable[[Tensor], tuple[Tensor, ...]], X: Tensor, anchors: Any):
        self.anchors = anchors  # keeps the key's objects (and so their ids) alive
        if X.requires_grad and torch.is_grad_enabled():
            sample = X.detach().clone().requires_grad_(True)
            self._call = torch.cuda.make_graphed_callables(
                fn, (sample,), num_warmup_iters=WARMUP_CALLS, allow_unused_input=True
            )
            return
        static_input = X.detach().clone()
        stream = torch.cuda.Stream(device=X.device)
        stream.wait_stream(torch.cuda.current_stream(X.device))
        with torch.cuda.stream(stream), torch.no_grad():
            for _ in range(WARMUP_CALLS):
                fn(static_input)
        torch.cuda.current_stream(X.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(graph):
            static_outputs = fn(static_input)

        def replay(X: Tensor) -> tuple[Tensor, ...]:
            static_input.copy_(X)
            graph.replay()
            return static_outputs

        self._call = replay

    def __call__(self, X: Tensor) -> tuple[Tensor, ...]:
        return tuple(output.clone() for output in self._call(X))


class GraphCache:
    r"""CUDA graphs of a function, captured per input shape and replayed after.

    Args:
        max_graphs: How many graphs to keep (least recently used dropped first).

    A cache copies as empty (``copy.deepcopy``, pickling): graphs belong to the
    tensors they were captured on.

    Example:
        >>> cache = GraphCache()
        >>> X = torch.rand(4, 3)
        >>> (y,) = cache("key", lambda X: (X.sum(-1),), X)  # on the CPU: eager
        >>> len(cache)
        0
    """

    def __init__(self, max_graphs: int = MAX_GRAPHS) -> None:
        self.max_graphs = max_graphs
        self._graphs: OrderedDict[Hashable, _Graphed | None] = OrderedDict()

    def __len__(self) -> int:
        return sum(graph is not None for graph in self._graphs.values())

    def __deepcopy__(self, memo: dict) -> GraphCache:
        return GraphCache(self.max_graphs)

    def __getstate__(self) -> dict:
        return {"max_graphs": self.max_graphs, "_graphs": OrderedDict()}

    def clear(self) -> None:
        r"""Drop every graph (and the memory it holds)."""
        self._graphs.clear()

    def __call__(
        self,
        key: Hashable,
        fn: Callable[[Tensor], tuple[Tensor, ...]],
        X: Tensor,
        anchors: Any = None,
    ) -> tuple[Tensor, ...]:
        r"""``fn(X)``, from a graph captured for ``key`` and ``X``'s shape where possible.

        Args:
            key: Names what ``fn`` reads besides ``X`` (e.g. the ids of the cached
                tensors); a new key captures a new graph.
            fn: Pure tensor work returning a tuple of tensors (see the module).
            X: The input; on a CPU, or where capture failed, ``fn`` runs eagerly.
            anchors: Objects kept alive with the graph (those whose ids are in ``key``).
        """
        if not X.is_cuda:
            return fn(X)
        grad = X.requires_grad and torch.is_grad_enabled()
        full_key = (key, tuple(X.shape), X.dtype, X.device, grad)
        if full_key in self._graphs:
            self._graphs.move_to_end(full_key)
            graph = self._graphs[full_key]
        else:
            graph = self._capture(fn, X, anchors)
            self._graphs[full_key] = graph
            while len(self._graphs) > self.max_graphs:
                self._graphs.popitem(last=False)
        if graph is None:  # capture failed for this key: eager from now on
            return fn(X)
        return graph(X)

    @staticmethod
    def _capture(fn: Callable, X: Tensor, anchors: Any) -> _Graphed | None:
        try:
            return _Graphed(fn, X, anchors)
        except Exception as error:  # (any failure: the eager path still serves)
            warnings.warn(
                f"CUDA graph capture failed ({error}); running eagerly.",
                CudaGraphWarning,
                stacklevel=4,
            )
            return None
