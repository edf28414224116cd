r"""How a :class:`~streamgp.models.WiskiGP` saves and loads its state.

The statistics change size with the data (rows in data space), so they are not
buffers: ``state_dict`` carries them as ``statistics.*`` entries (``stat_*`` in
checkpoints written before data space existed), with the grid they live on
(``grid.bounds``, ``grid.size``: the grid follows the data). These keys are the
checkpoint format. A checkpoint (:class:`~streamgp.models.base.CheckpointMixin`) also
keeps the grid options that decide future re-grids and the cached grid posterior, so
that a restored model predicts and continues the stream bit for bit.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from torch import Tensor

from streamgp.interpolation.exact import ExactKernelInputs, InputRows
from streamgp.interpolation.grid import CubicGridInterpolation, InterpolationWeights
from streamgp.linalg.data_space import DataPosterior
from streamgp.linalg.statistics import DataStatistics, GridStatistics
from streamgp.linalg.woodbury import GridPosterior
from streamgp.models._wiski.statistics import UNLIMITED_DATA_SPACE
from streamgp.models.utils.grids import build_grid, check_structured_kernel

_GRID_FIELDS = ("A", "b", "c", "n", "sum_log_noise", "sum_noise")
#: ``state_dict`` entries that belong to the data rather than to the hyperparameters:
#: the statistics (``stat_`` in checkpoints written before data space existed) and the
#: frozen transforms fitted on the first batch.
_DATA_KEY_PREFIXES = (
    "statistics.",
    "stat_",
    "input_transform.",
    "outcome_transform.",
    "observations.",
    "grid.",
)


class CheckpointStateMixin:
    r"""``state_dict`` entries of the statistics and the grid; checkpoint options.

    Part of :class:`~streamgp.models.WiskiGP`, which inherits its methods unchanged.
    """

    def _statistics_tensors(self) -> dict[str, Tensor]:
        r"""The statistics as named tensors (``state_dict`` entries under ``statistics.``)."""
        stats = self._statistics
        if isinstance(stats, GridStatistics):
            return {name: getattr(stats, name) for name in _GRID_FIELDS}
        weights = stats.weights
        tensors = {"y": stats.y}
        if isinstance(weights, InputRows):  # a kernel evaluated exactly: the inputs
            tensors["inputs"] = weights.inputs
        elif not weights.is_factored:  # factored rows are saved as their axes only
            tensors["indices"], tensors["values"] = weights.indices, weights.values
        for j, axis in enumerate(weights.axes):
            tensors[f"axis{j}_indices"], tensors[f"axis{j}_values"] = axis.indices, axis.values
        if stats.noise is not None:
            tensors["noise"] = stats.noise
        return tensors

    def _statistics_from_tensors(
        self, tensors: dict[str, Tensor]
    ) -> DataStatistics | GridStatistics:
        device, dtype = self._statistics.device, self._statistics.dtype

        def get(name: str) -> Tensor:
            value = tensors[name].to(device=device)
            return value.to(dtype) if value.is_floating_point() else value

        if "y" in tensors:
            saved_fixed_noise = "noise" in tensors
        else:  # grid statistics carry noise sums only with fixed noise
            saved_fixed_noise = bool((tensors["sum_noise"] != 0).any()) or (
                self.fixed_noise and not bool(tensors["n"] > 0)
            )
        if saved_fixed_noise != self.fixed_noise:
            raise ValueError(
                "its statistics' noise model (fixed or learned) differs from this model's."
            )
        m = self.interpolation.num_grid
        if "y" not in tensors:
            sums = {f: get(f) for f in _GRID_FIELDS}
            if sums["A"].shape[-1] != m:
                raise ValueError(
                    f"its statistics are on a grid of {sums['A'].shape[-1]} points, this "
                    f"model's grid has {m} (build it with the same grid_size and grid_bounds)."
                )
            return GridStatistics(gram=sums.pop("A"), **sums, fixed_noise=self.fixed_noise)
        interp = self.interpolation
        if "inputs" in tensors:  # (the caller made the kernel exact: _use_exact_kernel)
            inputs = get("inputs")
            if inputs.shape[-1] != interp.dim:
                raise ValueError(
                    f"its inputs have {inputs.shape[-1]} dimensions, this model's {interp.dim}."
                )
            noise = get("noise") if self.fixed_noise else None
            return DataStatistics(interp.weights(inputs), get("y"), noise)
        largest = [(tensors["indices"], m)] if "indices" in tensors else []
        largest += [
            (tensors[f"axis{j}_indices"], g)
            for j, g in enumerate(interp.grid_size)
            if f"axis{j}_indices" in tensors
        ]
        if "indices" not in tensors and len(largest) != len(interp.grid_size):
            raise ValueError("its rows have neither flat weights nor one set per grid axis.")
        if any(index.numel() and int(index.max()) >= size for index, size in largest):
            raise ValueError(
                f"its rows index a grid larger than this model's {m} points (build it with "
                "the same grid_size and grid_bounds)."
            )
        axes = tuple(
            InterpolationWeights(get(f"axis{j}_indices"), get(f"axis{j}_values"), g)
            for j, g in enumerate(interp.grid_size)
            if f"axis{j}_indices" in tensors
        )
        if "indices" in tensors:
            weights = InterpolationWeights(get("indices"), get("values"), interp.num_grid, axes)
        else:
            weights = InterpolationWeights(None, None, interp.num_grid, axes)
        return DataStatistics(weights, get("y"), get("noise") if self.fixed_noise else None)

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        self._fold_observed()
        super()._save_to_state_dict(destination, prefix, keep_vars)
        for name, value in self._statistics_tensors().items():
            destination[f"{prefix}statistics.{name}"] = value if keep_vars else value.detach()
        grid = self._grid_state()
        if grid is not None:  # the grid the statistics live on (it follows the data)
            destination[f"{prefix}grid.bounds"], destination[f"{prefix}grid.size"] = grid

    def _grid_state(self) -> tuple[Tensor, Tensor] | None:
        r"""The grid's box and sizes (``state_dict``'s ``grid.*``); None without a grid.
        (A model that evaluates its kernel exactly reports the grid it replaces.)"""
        grid = self.interpolation
        if isinstance(grid, ExactKernelInputs):
            grid = grid.grid_interpolation
        if not isinstance(grid, CubicGridInterpolation):
            return None
        return grid.bounds.detach(), torch.tensor(grid.grid_size)

    def _grid_from_state(self, bounds: Tensor, size: Tensor) -> tuple[Any, bool]:
        r"""The interpolation (and ``structured``) of a saved :meth:`_grid_state`."""
        grid_size = [int(g) for g in size.tolist()]
        # (The kernel is checked once the rows decide it: _use_exact_kernel.)
        return build_grid(
            bounds,
            bounds[:0],
            bounds,
            grid_size,
            self.covar_module,
            self.MAX_DENSE_GRID,
            check_kernel=False,
        )

    def _checkpoint_options(self) -> dict[str, Any]:
        return {
            **super()._checkpoint_options(),
            "fixed_noise": bool(self.fixed_noise),
            "keep_data": self.observations is not None,
            "grid_size": [int(g) for g in self.interpolation.grid_size],
            # train_X's batch dimensions: one model per member (every tensor has them).
            "batch_shape": [int(b) for b in self._input_batch_shape],
            "shared_hyperparameters": self._num_outputs > 1,
        }

    def _stream_state(self) -> dict[str, Any]:
        # The grid options that decide future re-grids (the grid itself is in state_dict).
        return {
            "grid_size": self._grid_size_option,
            "data_space_limit": self.data_space_limit,
            "keep_data": self.observations is not None,
            **self._posterior_state(),
        }

    def _posterior_state(self) -> dict[str, Any]:
        r"""The cached posterior, for a checkpoint (empty if there is none to save).

        The posterior of an observed model came from rank-``q`` updates (in grid space
        its root, in data space its Cholesky factor); saving its factors and prediction
        cache (rather than refactorising the statistics on restore) makes the restored
        model predict, and continue the stream, bit for bit as this one.
        """
        posterior = self._posterior
        if posterior is None or self._correction is not None or not self._caches_valid():
            return {}
        return {f"posterior_{name}": value for name, value in posterior.state().items()}

    def _set_posterior_state(self, state: dict[str, Any]) -> None:
        r"""Inverse of :meth:`_posterior_state` (after the statistics were loaded).

        Raises:
            ValueError: If the factors do not fit the statistics (naming the factor).
        """
        saved = {
            key.removeprefix("posterior_"): value
            for key, value in state.items()
            if key.startswith("posterior_")
        }
        if "root" in saved:
            self._posterior = GridPosterior.from_state(saved, self.interpolation.num_grid)
        elif "chol" in saved:
            if not isinstance(self._statistics, DataStatistics):
                raise ValueError("its data-space posterior factors come with grid statistics.")
            with torch.no_grad():
                root = self.kernel_root()
            self._posterior = DataPosterior.from_state(saved, root, self._statistics.weights)
        else:
            return
        self._snapshot_hyperparameters()

    def _set_stream_state(self, state: dict[str, Any]) -> None:
        keeps_data = self.observations is not None
        if bool(state.get("keep_data", keeps_data)) != keeps_data:
            raise ValueError("checkpoint: keep_data differs from this model's.")
        if "grid_size" in state:
            size = state["grid_size"]
            self._grid_size_option = size if size is None or isinstance(size, int) else list(size)
            self.data_space_limit = int(state["data_space_limit"])
        if self._holds_ski_rows_for_good():
            # Written before a WiskiGP from 4-D on evaluated its kernel exactly: exact SKI in
            # data space for good. Its rows are made again, as inputs, from the kept
            # observations, and its posterior factors (SKI's) are not restored.
            self._rows_from_kept_observations()
            return
        self._set_posterior_state(state)

    def _holds_ski_rows_for_good(self) -> bool:
        r"""Whether the model holds SKI rows in data space for good: a default grid from
        4-D on (structured, ``UNLIMITED_DATA_SPACE``) that interpolates its kernel."""
        return (
            self.data_space_limit >= UNLIMITED_DATA_SPACE
            and self.structured
            and self.interpolation.dim >= CubicGridInterpolation.FACTORED_FROM_DIM
            and not self.evaluates_kernel_exactly
            and isinstance(self._statistics, DataStatistics)
        )

    def _rows_from_kept_observations(self) -> None:
        r"""Evaluate the kernel exactly from now on: the rows become the kept observations'
        (transformed) inputs; the targets and noise are kept as they are.

        Raises:
            ValueError: Without kept observations, or if they are not the rows'.
        """
        statistics, store = self._statistics, self.observations
        if store is None or store.X.shape[-2] != statistics.count:
            kept = "no observations" if store is None else f"{store.X.shape[-2]} observations"
            raise ValueError(
                "checkpoint: its rows are SKI interpolation weights (written before a WiskiGP "
                f"from 4-D on evaluated its kernel exactly) and it keeps {kept} for its "
                f"{statistics.count} rows; rebuild the model from its data."
            )
        with torch.no_grad():
            X_t = self._transform_new_data(store.X, store.Y, store.Yvar)[0]
        self._use_exact_kernel(True)
        self._clear_caches()
        self._set_statistics(replace(statistics, weights=self.interpolation.weights(X_t)))

    def _use_exact_kernel(self, exact: bool) -> None:
        r"""Evaluate the kernel exactly (on the current grid's inputs) or interpolate it.

        Raises:
            ValueError: For the exact kernel on a grid that grid space can hold, or an
                interpolated kernel without Kronecker structure on a structured grid.
        """
        if not exact:
            grid = self.interpolation
            if self.evaluates_kernel_exactly:
                grid = grid.grid_interpolation
            if self.structured:
                check_structured_kernel(self.covar_module, grid, self.MAX_DENSE_GRID)
            self.interpolation = grid
            return
        if self.evaluates_kernel_exactly:
            return
        if not self.structured or self.interpolation.dim < CubicGridInterpolation.FACTORED_FROM_DIM:
            raise ValueError(
                "its rows are the inputs of a kernel evaluated exactly (a WiskiGP from 4-D on "
                "with the default grid), this model interpolates its kernel on a grid that "
                "grid space can hold (build it with the same grid_size)."
            )
        self.interpolation = ExactKernelInputs(self.interpolation)

    def _load_grid(self, bounds: Tensor, size: Tensor) -> None:
        r"""Move to the grid a checkpoint's statistics live on (before loading them)."""
        bounds = bounds.to(self.interpolation.bounds)
        current_bounds, current_size = self._grid_state()
        if torch.equal(size, current_size) and torch.equal(bounds, current_bounds):
            return
        if bounds.shape != current_bounds.shape or size.shape != current_size.shape:
            raise ValueError(
                f"its grid has {bounds.shape[-1]} input dimensions and sizes "
                f"{size.tolist()}, this model's {current_bounds.shape[-1]} and "
                f"{current_size.tolist()}."
            )
        interpolation, structured = self._grid_from_state(bounds, size)
        self._check_dense_for_outputs(interpolation, structured)
        self.interpolation, self.structured = interpolation, structured

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ):
        # The statistics change size with the data (rows in data space), so they are not
        # buffers; they are taken out here and the rest is loaded as usual.
        key = f"{prefix}statistics."
        tensors = {k[len(key) :]: state_dict.pop(k) for k in list(state_dict) if k.startswith(key)}
        legacy = f"{prefix}stat_"  # checkpoints written before data space existed
        tensors.update(
            {k[len(legacy) :]: state_dict.pop(k) for k in list(state_dict) if k.startswith(legacy)}
        )
        grid = {k: state_dict.pop(f"{prefix}grid.{k}", None) for k in ("bounds", "size")}
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )
        if not tensors:
            if strict:
                missing_keys.append(f"{key}*")
            return
        try:
            if grid["bounds"] is not None and grid["size"] is not None and self._grid_state():
                self._load_grid(grid["bounds"], grid["size"])
            # The kernel as the checkpoint's rows have it: exactly (their inputs) or
            # interpolated (SKI weights, grid sums) on the same grid.
            self._use_exact_kernel("inputs" in tensors)
            statistics = self._statistics_from_tensors(tensors)
        except (KeyError, ValueError) as error:
            error_msgs.append(f"WiskiGP statistics: {error}")
            return
        self._clear_caches()
        self._set_statistics(statistics)
