r"""Global settings of streamgp (context managers, as gpytorch's and BoTorch's settings).

:class:`skip_value_checks` switches off the checks that read tensor *values* on the host:
finite inputs, inputs inside the grid, positive noise, the info of every Cholesky
factorisation, and the value comparison that tells whether hyperparameters changed since
a cache was built. On a GPU each of these is a host synchronisation that stalls the
device queue; inside the context ``observe``, ``condition_on_observations``, building a
posterior and its mean, and the marginal likelihood of a :class:`~streamgp.WiskiGP`
run without one (tested on CPU by making every host read raise, and on CUDA under
``torch.cuda.set_sync_debug_mode("error")`` when a GPU is present).

What changes inside it:

- Bad values are not reported: NaN inputs give NaN outputs, a point outside the grid
  is clamped to it, a non-positive-definite matrix gives NaNs instead of an error.
- Cached posteriors follow gpytorch's convention instead of comparing hyperparameter
  values: a cache stays valid until the model's state changes (``observe``, a load,
  a device move) or the model is put in training mode (``model.train()``, as
  ``fit_gpytorch_mll`` does). A hyperparameter set by assignment while the model is in
  eval mode is therefore not seen until ``model.train()`` is called.

Example:
    >>> import torch
    >>> from streamgp import WiskiGP
    >>> from streamgp.settings import skip_value_checks
    >>> X = torch.rand(20, 2, dtype=torch.float64)
    >>> model = WiskiGP(X, X.sum(-1, keepdim=True), grid_size=10)
    >>> with skip_value_checks():
    ...     model.observe(X[:3], X[:3].sum(-1, keepdim=True)).num_train
    23
"""

from __future__ import annotations

from gpytorch.settings import _feature_flag

__all__ = ["skip_value_checks"]


class skip_value_checks(_feature_flag):  # noqa: N801 (gpytorch's settings style)
    r"""Skip the value checks that synchronise a GPU with the host (see the module)."""

    _default = False
