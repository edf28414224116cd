r"""The persistent per-batch optimizer of the streaming variational models.

``OnlineSVGP`` and ``DecoupledSVGP`` take ``num_steps`` optimizer steps on every
batch they absorb. Adam's moment estimates are worth keeping between batches, but
only while the parameters are the same tensors: a model that replaces a parameter
(new inducing points, a grown basis) needs a new optimizer, or a patched one.
:class:`PersistentOptimizerMixin` holds that logic once.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from streamgp.models.utils.transaction import TransactionalMixin, transaction


class PersistentOptimizerMixin(TransactionalMixin):
    r"""An optimizer built lazily and kept across batches while its parameters persist.

    A class using it calls :meth:`_init_optimizer` in its constructor and implements
    :meth:`_trainable_parameters`; :meth:`_get_optimizer` then returns the optimizer
    for the next step. Its updates run in :meth:`_guarded`, which restores the model's
    declared :attr:`mutable_state` if they fail. A device or dtype move of the model
    (``.to``) moves the optimizer's state with the parameters.
    """

    optimizer_cls: type[torch.optim.Optimizer]
    keep_optimizer_state: bool

    def _init_optimizer(
        self,
        optimizer_cls: type[torch.optim.Optimizer],
        optimizer_kwargs: dict[str, Any] | None,
        lr: float,
        keep_optimizer_state: bool,
    ) -> None:
        self.optimizer_cls = optimizer_cls
        self.optimizer_kwargs = {"lr": lr} if optimizer_kwargs is None else dict(optimizer_kwargs)
        self.keep_optimizer_state = keep_optimizer_state
        self._optimizer: torch.optim.Optimizer | None = None
        self._optimizer_params: list[Tensor] = []

    def _trainable_parameters(self) -> list[Tensor]:
        raise NotImplementedError

    @property
    def optimizer_kwargs(self) -> dict[str, Any]:
        r"""Keyword arguments of ``optimizer_cls``; setting them starts a new optimizer."""
        return self._optimizer_kwargs

    @optimizer_kwargs.setter
    def optimizer_kwargs(self, value: dict[str, Any]) -> None:
        self._optimizer_kwargs = dict(value)
        self._optimizer = None  # the next step builds one with the new settings

    def _get_optimizer(self) -> torch.optim.Optimizer | None:
        r"""The optimizer of the trainable parameters (``None`` if there are none).

        A new one is built when there is none yet, when the trainable tensors changed,
        or when ``keep_optimizer_state`` is off.
        """
        params = self._trainable_parameters()
        if not params:
            return None
        same = len(params) == len(self._optimizer_params) and all(
            p is q for p, q in zip(params, self._optimizer_params, strict=True)
        )
        if self._optimizer is None or not same or not self.keep_optimizer_state:
            self._optimizer = self.optimizer_cls(params, **self.optimizer_kwargs)
            self._optimizer_params = params
        return self._optimizer

    def _optimizer_state(self) -> dict[str, Any] | None:
        r"""The persistent optimizer's state (tensors and numbers only), for checkpoints."""
        return None if self._optimizer is None else self._optimizer.state_dict()

    def _load_optimizer_state(self, state: dict[str, Any] | None) -> None:
        self._optimizer = None
        if state is not None:
            optimizer = self._get_optimizer()
            if optimizer is not None:
                optimizer.load_state_dict(state)

    def _apply(self, fn: Callable[[Tensor], Tensor], *args: Any, **kwargs: Any) -> Any:
        # torch's hook behind ``.to``, ``.double()``, ``.cuda()``: the parameters are moved
        # in place (the same tensors, so the optimizer is kept), then its state follows
        # them by torch's own rule (``load_state_dict`` casts each state tensor to its
        # parameter's device and floating dtype; Adam's ``step`` counter stays where
        # torch keeps it).
        super()._apply(fn, *args, **kwargs)
        optimizer = self._optimizer
        if optimizer is not None:
            optimizer.load_state_dict(optimizer.state_dict())
        return self

    def _after_rollback(self) -> None:
        # The optimizer's state saw the failed steps: dropped (:meth:`_guarded` puts back
        # the one from before the update, so that a retry continues as it would have).
        self._optimizer = None

    def _guarded(self, update: Callable[[], Any]) -> None:
        r"""Run ``update``; restore the model if it raises or leaves non-finite parameters.

        A :func:`~streamgp.models.utils.transaction.transaction` over the model's
        :attr:`mutable_state`, for any exception (an interrupt included), which also
        restores the optimizer and its state (Adam's moments): a retry of the update
        then takes exactly the steps an uninterrupted one would have.
        """
        optimizer = self._optimizer
        saved = None
        if optimizer is not None:  # its state tensors are written in place by the steps
            saved = (optimizer, self._optimizer_params, copy.deepcopy(optimizer.state_dict()))
        try:
            with transaction(self):
                update()
                if not all(torch.isfinite(p).all() for p in self._trainable_parameters()):
                    raise RuntimeError(
                        "The update produced non-finite parameters (the optimizer diverged); "
                        "the model was restored. Lower the learning rate."
                    )
        except BaseException:
            if saved is not None:
                self._optimizer, self._optimizer_params, state = saved
                self._optimizer.load_state_dict(state)
            raise

    def custom_fit(
        self,
        mll: Any,
        closure: Callable[..., Any] | None = None,
        closure_kwargs: dict[str, Any] | None = None,
        optimizer_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> Any:
        r"""What ``botorch.fit.fit_gpytorch_mll`` runs for this model: its own optimizer.

        BoTorch hands a model with ``custom_fit`` the fit. Quasi-Newton on the
        variational parameters (BoTorch's default for a marginal likelihood) takes
        thousands of evaluations of a streaming ELBO, so the model's own optimizer
        (``optimizer_cls`` with ``optimizer_kwargs``, kept across batches) takes
        ``num_init_steps`` steps on the model's objective (``compute_custom_loss``),
        or ``optimizer_kwargs["step_limit"]`` (also read from
        ``optimizer_kwargs["options"]["maxiter"]``) steps.

        Returns:
            ``mll`` in eval mode. If the steps diverge, the model is restored and
            ``RuntimeError`` is raised.
        """
        options = dict(optimizer_kwargs or {})
        num_steps = options.get("step_limit", options.get("options", {}).get("maxiter"))
        num_steps = self.num_init_steps if num_steps is None else int(num_steps)

        def fit() -> None:
            optimizer = self._get_optimizer()
            if optimizer is None:
                return

            def step() -> Tensor:
                optimizer.zero_grad()
                if closure is None:
                    loss = self.compute_custom_loss(mll)
                    loss.backward()
                else:  # BoTorch's closures set the gradients themselves
                    loss, _ = closure(**(closure_kwargs or {}))
                return loss

            for _ in range(num_steps):
                optimizer.step(step)

        mll.train()
        try:
            self._guarded(fit)
        finally:
            mll.eval()
        return mll
