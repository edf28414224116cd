r"""The loops' one model adapter: build, absorb, refit and checkpoint any registered model.

A loop needs four things from a model, whatever it is: build it on an initial design,
absorb a new batch, refit its hyperparameters (warm-started from the current ones), and
expose a BoTorch :class:`~botorch.models.model.Model` for acquisition functions.
:class:`Surrogate` does all four for every entry of the model registry
(:mod:`streamgp.models.registry`), following the entry's rules:

- a model with ``observe`` (WISKI, O-SVGP, SoftKI, ...) absorbs the batch itself, in
  constant time for the streaming models; one without (BoTorch's ``SingleTaskGP``, the
  ``"exact"`` entry) is rebuilt on all data kept so far, its hyperparameters
  warm-started, as a BoTorch user does (``O(n^3)`` per step);
- a refit is the entry's (``fit_gpytorch_mll`` on its marginal likelihood by default;
  more Adam steps on the last batch's bound for O-SVGP, as the WISKI paper refits it);
- the state is the model's own ``checkpoint()`` where it has one (the stream resumes
  exactly), else the kept data and the hyperparameters.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from botorch.models.model import Model
from gpytorch.kernels import Kernel
from torch import Tensor

from streamgp.models.registry import choose_model, get_model_spec, registered_models

__all__ = [
    "KernelFactory",
    "Surrogate",
    "choose_surrogate",
    "check_model_options",
    "make_surrogate",
    "surrogate_names",
]

#: Builds the covariance module for a given input dimension (``None``: the model's default).
KernelFactory = Callable[[int], Kernel]

#: ``--models auto``: the registry's rule (WISKI up to 3-D, the additive WISKI above).
choose_surrogate = choose_model


class Surrogate:
    r"""A registered model the loops can build, update, refit and hand to BoTorch.

    Args:
        name: The registry name (``"wiski"``, ``"exact"``, ...; see
            :func:`~streamgp.models.registry.registered_models`).
        train_X: ``n x d`` initial inputs (in the unit cube for the loops).
        train_Y: ``n x 1`` initial targets.
        train_Yvar: Optional ``n x 1`` known observation noise variances.
        kernel_factory: Optional ``d -> Kernel``; the entry's default kernel otherwise.
        **options: The entry's options (``spec.options`` lists them with their
            defaults); an unknown one is refused, naming it.

    Example:
        >>> X = torch.rand(5, 2, dtype=torch.float64)
        >>> s = Surrogate("wiski", X, X.sum(-1, keepdim=True), grid_size=12)
        >>> s.update(torch.rand(3, 2, dtype=torch.float64), torch.rand(3, 1, dtype=torch.float64))
        >>> s.model.num_train
        8
        >>> s = Surrogate("exact", X, X.sum(-1, keepdim=True))
        >>> s.update(torch.rand(3, 2, dtype=torch.float64), torch.rand(3, 1, dtype=torch.float64))
        >>> s.model.train_inputs[0].shape
        torch.Size([8, 2])
    """

    def __init__(
        self,
        name: str,
        train_X: Tensor,
        train_Y: Tensor,
        train_Yvar: Tensor | None = None,
        *,
        kernel_factory: KernelFactory | None = None,
        **options: Any,
    ) -> None:
        self.spec = get_model_spec(name)
        if not self.spec.loops:
            choices = list(registered_models(loop="bo"))
            raise ValueError(f"model must be one of {choices}, got {name!r}.")
        self.name = name
        self.options = self.spec.resolve_options(options)
        self.fixed_noise = train_Yvar is not None
        self.kernel_factory = kernel_factory
        # Models without ``observe`` are rebuilt on all data: keep it.
        self.X, self.Y, self.Yvar = train_X, train_Y, train_Yvar
        self._model = self._build(hyperparameters=None)

    @property
    def _streams(self) -> bool:
        # The model holds the stream (absorbs and checkpoints it); else the data kept here.
        return self.spec.incremental and self.spec.checkpoints

    @property
    def model(self) -> Model:
        r"""The current BoTorch model, in eval mode."""
        return self._model

    def _build(self, hyperparameters: dict[str, Tensor] | None) -> Model:
        covar_module = (
            None if self.kernel_factory is None else self.kernel_factory(self.X.shape[-1])
        )
        model = self.spec.make(self.X, self.Y, self.Yvar, covar_module=covar_module, **self.options)
        if hyperparameters is not None:
            # Parameters sized by the data (batch SoftKI's points, chosen from it) are
            # chosen again by the rebuild; the rest are warm-started.
            own = model.state_dict()
            fitting = {
                k: v for k, v in hyperparameters.items() if k in own and own[k].shape == v.shape
            }
            model.load_state_dict(fitting, strict=False)
        return model.eval()

    def _hyperparameters(self) -> dict[str, Tensor]:
        # The outcome transform's statistics are data, not hyperparameters: the rebuild
        # refits them on all data; fixed noise levels are data too.
        return {
            key: value
            for key, value in self._model.state_dict().items()
            if not key.startswith("outcome_transform") and "noise_covar.noise" not in key
        }

    def update(self, X: Tensor, Y: Tensor, Yvar: Tensor | None = None) -> None:
        r"""Absorb a batch (``Yvar`` exactly when the surrogate has known noise)."""
        if (Yvar is None) == self.fixed_noise:
            raise ValueError("Yvar must be given exactly when the surrogate has fixed noise.")
        if self.spec.incremental:
            self._model.observe(X, Y, Yvar)
            return
        self.X, self.Y = torch.cat([self.X, X]), torch.cat([self.Y, Y])
        if Yvar is not None:
            self.Yvar = torch.cat([self.Yvar, Yvar])
        self._model = self._build(self._hyperparameters())

    def fit(self, max_iter: int | None = None) -> None:
        r"""Refit, warm-started from the current parameters.

        ``max_iter`` caps the optimizer's iterations (L-BFGS-B for the marginal
        likelihood, Adam steps for O-SVGP); ``None`` is the entry's default.
        """
        self.spec.fit(self._model, max_iter, fixed_noise=self.fixed_noise, **self.options)

    def state_dict(self) -> dict[str, Any]:
        r"""Everything needed to resume (with :meth:`load_state_dict`): tensors only."""
        if self._streams:
            return {"model": self._model.checkpoint()}
        return {"X": self.X, "Y": self.Y, "Yvar": self.Yvar, "model": self._hyperparameters()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        r"""Restore the state saved by :meth:`state_dict`."""
        if self._streams:
            self._model.restore(state["model"])
            self._model.eval()
            return
        self.X, self.Y, self.Yvar = state["X"], state["Y"], state["Yvar"]
        self._model = self._build(state["model"])


def make_surrogate(
    name: str,
    train_X: Tensor,
    train_Y: Tensor,
    train_Yvar: Tensor | None = None,
    **options: Any,
) -> Surrogate:
    r"""The :class:`Surrogate` of the model registered as ``name``.

    Raises:
        ValueError: ``name`` is not registered (the message lists the choices), or an
            option is not the entry's.
    """
    return Surrogate(name, train_X, train_Y, train_Yvar, **options)


def surrogate_names() -> tuple[str, ...]:
    r"""The names the BO and active-learning loops accept (registered now)."""
    return registered_models(loop="bo")


def check_model_options(name: str, options: dict[str, Any] | None) -> None:
    r"""Refuse, before a loop starts, a model that is not registered or an option it
    does not take (``kernel_factory`` is the loops' own)."""
    options = {k: v for k, v in (options or {}).items() if k != "kernel_factory"}
    spec = get_model_spec(name)
    if not spec.loops:
        raise ValueError(f"model must be one of {list(surrogate_names())}, got {name!r}.")
    spec.resolve_options(options)
