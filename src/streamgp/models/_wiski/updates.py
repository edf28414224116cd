r"""How a :class:`~streamgp.models.WiskiGP` takes new observations.

- ``observe``: in place and transactional; in grid space small batches are held as a
  low-rank correction and folded every ``FOLD_RANK`` ranks; an observation outside the
  grid's box re-grids (:mod:`.rebuild`).
- ``condition_on_observations``: a new model (a view) with a rank-``q`` correction of
  this one's posterior, as BoTorch's fantasies need.
- ``subset_output``: a view of some outputs.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

import torch
from botorch.exceptions.errors import UnsupportedError
from botorch.models.utils import mod_batch_shape
from gpytorch.means import ConstantMean
from torch import Tensor

from streamgp.interpolation.grid import GridBox, InterpolationWeights, grown_grid_bounds
from streamgp.linalg.woodbury import GridPosterior
from streamgp.models.utils import conditioning_noise, shallow_view, transaction
from streamgp.models.utils.fixed_noise import bind_row_noise
from streamgp.models.utils.observations import ObservationStore
from streamgp.settings import immediate_value_checks, skip_value_checks
from streamgp.utils.validation import (
    check_conditioning_data,
    check_new_observations,
    check_tensor,
)

if TYPE_CHECKING:
    from streamgp.models.wiski import WiskiGP


class UpdatesMixin:
    r"""``observe``, ``condition_on_observations``, ``subset_output`` and views.

    Part of :class:`~streamgp.models.WiskiGP`, which inherits its methods unchanged.
    """

    def observe(self, X: Tensor, Y: Tensor, Yvar: Tensor | None = None) -> WiskiGP:
        r"""Absorb new observations in place, in ``O(m^2 q)`` time (independent of ``n``).

        Args:
            X: ``q x d`` new inputs (original space).
            Y: ``q x k`` new targets (``k`` outputs) (original space).
            Yvar: ``q x k`` noise variances (original space); required exactly when
                the model was built with ``train_Yvar``.

        Returns:
            The model itself. On invalid input, or any failure (a factorisation, an
            interrupt) on the way, raises and leaves the model unchanged.
        """
        with transaction(self):  # any exception (KeyboardInterrupt too) rolls back
            return self._observe(X, Y, Yvar)

    def _observe(self, X: Tensor, Y: Tensor, Yvar: Tensor | None) -> WiskiGP:
        with self._checked_call() as checks:  # one host read of the value checks
            check_new_observations(
                X,
                Y,
                Yvar,
                like=self.interpolation.bounds,
                dim=self.interpolation.dim,
                fixed_noise=self.fixed_noise,
                num_outputs=self.num_outputs,
                batch_shape=self._input_batch_shape,
            )
            q = X.shape[-2]
            X_t, Y_t, Yvar_t = self._transform_new_data(X, Y, Yvar)
            if self._conditioning_log and len(self._internal_batch_shape) > 0 and q:
                raise RuntimeError(
                    "observe is not available on a model conditioned on batched (fantasy) "
                    "observations; observe on the parent model instead."
                )
            outside = []  # set at the read: whether a kept-data model must re-grid
            if self.observations is None:
                self._check_observed_inputs(X_t)
            elif not skip_value_checks.on() and q:
                flag = self.interpolation.any_outside(X_t)
                checks.decide(flag, outside.append)
            noise = None if Yvar_t is None else self._shared_noise(Yvar_t, "Yvar")
            self._read_checks(checks)
            if outside and outside[0]:
                with immediate_value_checks():
                    bounds = grown_grid_bounds(self.interpolation.bounds, X_t.detach())
                    self._regrid(bounds, X, Y, Yvar)
                return self
            if q == 0:
                return self
            self._observe_on_grid(X_t, Y_t, noise)
            self._pending_failure = self._take_failures(checks)
        if self.observations is not None:
            self.observations.append(X, Y, Yvar)
        return self

    def _check_observed_inputs(self, X_t: Tensor) -> None:
        r"""Check observed inputs (transformed) against the interpolation's domain, in the
        call's one read: a grid without kept data refuses points outside its box."""
        self.interpolation.check_inside(X_t, "X")

    def _observe_on_grid(self, X_t: Tensor, Y_t: Tensor, noise: Tensor | None) -> None:
        r"""Absorb transformed rows inside the grid (the update of :meth:`observe`), with
        their shared noise variances (``q``, fixed noise) or None."""
        weights = self.interpolation.weights(X_t)
        y = self._targets(Y_t)
        if self._can_defer(y.shape[-1]):
            self._defer(X_t.detach() if X_t.requires_grad else X_t, weights, y)
            return
        self._fold_conditioning()
        with torch.no_grad():
            statistics = self._statistics.add(weights, y, noise)
            posterior = self._updated_posterior(weights, self._residuals(y), noise, statistics)
        self._posterior = posterior
        self._switch_space_if_needed(statistics)

    def _can_defer(self, q: int) -> bool:
        return (
            isinstance(self._posterior, GridPosterior)
            and not self.fixed_noise  # its likelihood holds the mean noise of all rows
            and not self._data_batch_shape  # (the conditioning log is a fantasy's batch)
            and q <= self.ROOT_UPDATE_MAX_FRACTION * self.interpolation.num_grid
            and self._caches_valid()
        )

    def _defer(self, X_t: Tensor, weights: InterpolationWeights, y: Tensor) -> None:
        with torch.no_grad():
            posterior = self.exact_posterior()
            noise = self.noise_variance.detach().expand(y.shape[-1:])
            self._correction = self._current_correction().condition(
                posterior, weights, self._residuals(y), noise
            )
        # A new list: views made earlier share the old one.
        self._conditioning_log = [*self._conditioning_log, (X_t, y, noise)]
        if self._correction.rank >= self.FOLD_RANK:
            self._fold_conditioning()

    def condition_on_observations(
        self, X: Tensor, Y: Tensor, noise: Tensor | None = None, **kwargs: Any
    ) -> WiskiGP:
        r"""A new model conditioned on ``(X, Y)``, sharing this model's grid root.

        The new model holds a rank-``q`` correction of this model's posterior (no
        copy of the ``m x m`` root), costs ``O(b m q)`` memory for ``b`` batches, and
        is differentiable with respect to ``X`` (as qNIPV / qKG need). It shares the
        kernel, likelihood and transform modules with this model (a view, not a
        deep copy); ``observe`` on this model later does not affect it.

        Args:
            X: ``batch_shape x q x d`` inputs (original space).
            Y: ``sample_shape x batch_shape x q x k`` targets (original space).
            noise: Optional ``batch_shape x q x k`` noise variances in the
                outcome-transformed space (BoTorch's convention); default: the
                model's noise level (mean training noise for fixed noise).

        Returns:
            A ``WiskiGP`` with batch shape ``sample_shape + broadcast(batch, model.batch)``.
        """
        regrids = self.observations is not None  # it keeps its data: never a refusal
        given_noise = noise
        with self._checked_call() as checks:  # one host read of the value checks
            check_conditioning_data(
                X,
                Y,
                noise,
                like=self.interpolation.bounds,
                dim=self.interpolation.dim,
                num_outputs=self.num_outputs,
                # A grid box's check_inside refuses NaN and Inf too (they leave the box);
                # with kept data they are refused below, before a re-grid.
                finite_X=not isinstance(self.interpolation, GridBox),
            )
            X_t, Y_t, _ = self._transform_new_data(X, Y)
            outside = []  # set at the read: whether X leaves the grid of a kept-data model
            if not regrids:
                self.interpolation.check_inside(X_t, "X")
            elif not skip_value_checks.on():
                checks.decide(self.interpolation.any_outside(X_t), outside.append)
            if noise is not None and self._num_outputs > 1:
                noise = self._shared_noise(noise, "noise").unsqueeze(-1)
            elif noise is not None and self._output_members:  # each output's own rows
                noise = noise.movedim(-1, -2).unsqueeze(-1)
            self._read_checks(checks)
            if outside and outside[0]:
                with immediate_value_checks():
                    check_tensor(X, "X", finite=True)  # (NaN and Inf "leave" the box too)
                # Conditioned on the same data on a grid that covers X (this model is
                # unchanged: its predictions do not move under an acquisition's search).
                sibling = self._regridded_sibling(X_t.detach())
                return sibling.condition_on_observations(X, Y, given_noise, **kwargs)
            posterior = self.exact_posterior()
            y = self._targets(Y_t)
            if noise is None and self._data_batch_shape:  # each member's own level
                level = self._observation_noise_variance().detach()  # batch x 1
                noise_q = level.expand(torch.broadcast_shapes(level.shape, X_t.shape[:-1]))
            else:
                noise_q = self._row_noise(conditioning_noise(noise, self, X))
            correction = self._current_correction().condition(
                posterior, self._rows(X_t), self._residuals(y), noise_q
            )
            new = self._view()
            new._correction = correction
            new._conditioning_log = [*self._conditioning_log, (X_t, y, noise_q)]
            new._log_from_observe = False
            new._pending_failure = self._take_failures(checks)  # read with its first call
        return new

    def _regridded_sibling(self, X_t: Tensor) -> WiskiGP:
        r"""This model on a grid that also covers the transformed inputs ``X_t``: a view
        whose statistics are rebuilt from every kept observation (exact, as a re-grid).

        What ``condition_on_observations`` conditions when its inputs leave the grid
        (qKG or qNIPV candidates beyond the data's box under ``Normalize(d)`` without
        bounds). It is kept until this model's data, grid or hyperparameters change and
        grown geometrically, so an acquisition's search re-grids ``O(log)`` times, not at
        every call: ``O(n 4^d)`` for the rows plus a factorisation at its first use.
        """
        store = self.observations
        key = (self._statistics, self.interpolation, len(store))
        cached = self._regrid_sibling
        valid = cached is not None and (
            cached[0][0] is key[0] and cached[0][1] is key[1] and cached[0][2] == key[2]
        )
        if valid and not bool(cached[1].interpolation.any_outside(X_t)):
            return cached[1]
        base = cached[1] if valid else self  # grown from the grown grid, if still valid
        bounds = grown_grid_bounds(base.interpolation.bounds, X_t)
        with immediate_value_checks():
            interpolation, structured, statistics = self._statistics_on_new_grid(
                bounds, store.X, store.Y, store.Yvar
            )
        sibling = self._view()
        sibling.interpolation, sibling.structured = interpolation, structured
        sibling._clear_caches()
        sibling._set_statistics(statistics)
        sibling._row_source = (store, sibling._statistics, None, len(store))
        self._regrid_sibling = (key, sibling)
        return sibling

    def subset_output(self, idcs: list[int]) -> WiskiGP:
        r"""A model of the outputs ``idcs`` only, as BoTorch's ``subset_output``.

        A view: the rows, the Gram statistics and the root stay shared; only the selected
        outputs' targets, ``W^T y``, ``y^T y`` and grid means are taken (``O(|idcs| m)``).
        The outcome transform is subset with it. For a model without a batch (fantasy)
        shape.

        Args:
            idcs: Output indices, each in ``[0, num_outputs)``.

        Returns:
            A ``WiskiGP`` with ``len(idcs)`` outputs (single-output for one index).
        """
        k = self.num_outputs
        idcs = list(idcs)
        if not idcs or any(not isinstance(i, int) or not 0 <= i < k for i in idcs):
            raise ValueError(f"idcs must be output indices in [0, {k}), got {idcs}.")
        if self._output_members:
            return self._subset_members(idcs)
        if self._data_batch_shape:
            raise UnsupportedError(
                "subset_output on a WiskiGP with batched training data is not supported yet."
            )
        if len(self.batch_shape) > 0:
            raise RuntimeError(
                "subset_output is not available on a model conditioned on batched (fantasy) "
                "observations; take it on the parent model."
            )
        new = self._view()
        if idcs == list(range(k)):
            return new
        index = torch.tensor(idcs, device=self.interpolation.bounds.device)

        def pick(tensor: Tensor, dim: int) -> Tensor:  # ``dim``: the output dimension
            if len(idcs) == 1:
                return tensor.select(dim, idcs[0])
            return tensor.index_select(dim, index)

        new._num_outputs = len(idcs)
        new._statistics = self._statistics.select_outputs(pick)
        if self._kept_rows() is not None:  # the kept rows of these outputs
            store, _, outputs, n = new._row_source
            outputs = idcs if outputs is None else [outputs[i] for i in idcs]
            new._row_source = (store, new._statistics, outputs, n)
        if self._posterior is not None:
            new._posterior = self._posterior.select_outputs(pick)
        if self._correction is not None:
            new._correction = self._correction.select_outputs(pick)
        new._conditioning_log = [(X, pick(y, -2), noise) for X, y, noise in self._conditioning_log]
        new._love_cache = None
        transform = getattr(self, "outcome_transform", None)
        if transform is not None:
            new.outcome_transform = transform.subset_output(idcs)
        if isinstance(self.mean_module, ConstantMean) and self.mean_module.constant.numel() > 1:
            # BoTorch's subset_output copies the picked outputs' hyperparameters.
            constant = self.mean_module.constant.detach()
            mean_module = ConstantMean(batch_shape=pick(constant, -1).shape).to(constant)
            mean_module.constant = pick(constant, -1)
            new.mean_module = mean_module
        return new

    def _subset_members(self, idcs: list[int]) -> WiskiGP:
        r""":meth:`subset_output` of outputs with their own hyperparameters: a model of
        the chosen outputs rebuilt from the kept observations on this model's grid, with
        its frozen transforms and those outputs' hyperparameters (``O(n 4^d)``, exact: it
        equals this model's outputs ``idcs``)."""
        if self._correction is not None or self._conditioning_log:
            raise RuntimeError(
                "subset_output is not available on a model conditioned on (fantasy) "
                "observations; take it on the parent model."
            )
        rows = self._kept_rows()
        if rows is None:
            raise UnsupportedError(
                "subset_output of outputs with their own hyperparameters rebuilds them from "
                "the kept observations, and this model keeps none (keep_data=False)."
            )
        if idcs == list(range(self.num_outputs)):
            return self._view()
        X, Y, Yvar = rows
        Y, Yvar = Y[..., idcs], None if Yvar is None else Yvar[..., idcs]
        transform = getattr(self, "outcome_transform", None)
        subset_transform = None if transform is None else transform.subset_output(idcs).eval()
        Y_t, Yvar_t = (Y, Yvar) if subset_transform is None else subset_transform(Y, Yvar)
        # (A fixed-noise likelihood is the rows' noise, bound to this model: the new model
        # binds its own.)
        names = ("covar_module", "mean_module") + (() if self.fixed_noise else ("likelihood",))
        modules = {
            name: subset_member_parameters(
                copy.deepcopy(getattr(self, name)), idcs, self._data_batch_shape
            )
            for name in names
        }
        input_transform = getattr(self, "input_transform", None)
        with torch.no_grad():
            new = type(self)(
                X,
                Y_t,
                Yvar_t,
                likelihood=modules.get("likelihood"),
                covar_module=modules["covar_module"],
                mean_module=modules["mean_module"],
                outcome_transform=None,
                input_transform=copy.deepcopy(input_transform),
                grid_size=list(self.interpolation.grid_size),
                grid_bounds=self.interpolation.bounds.clone(),
                extrapolation=self.extrapolation,
                data_space_limit=0,
                exact_prior_variance=self.exact_prior_variance,
            )
        if subset_transform is not None:  # frozen as this model's; the raw rows kept
            new.outcome_transform = subset_transform
            new.observations = ObservationStore(X, Y, Yvar)
        new.love_tolerance = self.love_tolerance
        if "LIKELIHOOD_TOLERANCE" in vars(self):  # a per-model override
            new.LIKELIHOOD_TOLERANCE = self.LIKELIHOOD_TOLERANCE
        return new

    def _view(self) -> WiskiGP:
        r"""A new model object sharing this one's tensors and hyperparameter modules.

        Cheap (no tensor or module copies): the statistics and grid factors are
        immutable in practice (``observe`` replaces them rather than writing into
        them), and a shared kernel/likelihood means a conditioned model is a view of
        its parent with extra data. Changing hyperparameters on either model makes
        that model rebuild its own factors from its own statistics.

        A view keeps no raw observations (its parent's store grows in place): it cannot
        re-grid, and refuses observations outside its grid.
        """
        new = shallow_view(self)
        new._regrid_sibling = None
        if self.observations is not None:
            new._row_source = (self.observations, self._statistics, None, self._stored_count())
        new.observations = None
        if self.fixed_noise:  # its own likelihood: its rows' noise, never the parent's
            new.likelihood = bind_row_noise(new)
        return new


def subset_member_parameters(
    module: torch.nn.Module, idcs: list[int], member_batch: torch.Size
) -> torch.nn.Module:
    r"""``module`` (a copy) with the outputs ``idcs`` of its parameters batched over
    ``member_batch`` (``train_X``'s batch, then the outputs): as BoTorch's
    ``BatchedMultiOutputGPyTorchModel.subset_output``, the output dimension indexed
    (dropped for one output) and the modules' ``batch_shape`` changed with it.
    Parameters without that batch (a module shared by the outputs) are kept whole."""
    dim = len(member_batch) - 1
    index = torch.tensor(idcs)
    holder = torch.nn.Module()  # (mod_batch_shape walks names from a parent module)
    holder.module = module
    for name, parameter in list(module.named_parameters()):
        if parameter.shape[: dim + 1] != member_batch:
            continue
        value = parameter.data.index_select(dim, index.to(parameter.device))
        parameter.data = value.squeeze(dim) if len(idcs) == 1 else value
        path = ["module", *name.split(".")[:-1]]
        mod_batch_shape(holder, path, len(idcs) if len(idcs) > 1 else 0)
    return module
