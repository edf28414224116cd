r"""Learned input projection ``h(x; phi)`` for grid-based models in more than 3 dimensions.

SKI grids grow exponentially with the input dimension, so WISKI (Stanton, Maddox,
Delbridge & Wilson, "Kernel Interpolation for Scalable Online Gaussian Processes",
AISTATS 2021, sections 4.3 and 5.1) interpolates on a low-dimensional learned
projection of the inputs: a linear map ``R^d -> R^k`` (``k = 2`` in the paper),
batch normalisation and ``tanh``, so features lie in ``(-1, 1)^k`` and always inside
a grid on ``[-1, 1]^k``. The parameters ``phi`` are trained with the GP's marginal
likelihood (deep kernel learning, Wilson et al. 2016).

Online (the paper's eq. 18), the interpolation weights of points already absorbed are
*not* recomputed when ``phi`` changes: the statistics ``W^T W``, ``W^T y`` of old points
stay frozen and only new points are projected with the updated ``phi``. The projection
is therefore applied *outside* the model (a WiskiGP's own input transform is frozen
after construction): the caller projects ``X`` and gives the features to ``observe``,
``condition_on_observations`` and ``posterior``. :class:`streamgp.loops.stream`
implements that protocol.

A model that keeps all its data (an exact GP) can instead recompute every feature from
the current ``phi``, batch style: :class:`ProjectedKernel` puts the projection inside
the kernel, ``k(x, x') = k_base(h(x), h(x'))`` (the WISKI paper's exact-GP baseline
learns the same projection).

Batch normalisation: in training mode (batch pretraining) it normalises with the batch
statistics and tracks running statistics; in eval mode (streaming, where a batch may
be a single point) it uses the running statistics, whose affine parameters stay
learnable. :meth:`LearnedProjection.calibrate` sets the running statistics to those of
a given batch (e.g. the pretraining set at the end of pretraining).

References:

.. [Stanton2021] S. Stanton, W. J. Maddox, I. Delbridge, A. G. Wilson. Kernel
    Interpolation for Scalable Online Gaussian Processes. International Conference on
    Artificial Intelligence and Statistics, 2021.
.. [Wilson2016] A. G. Wilson, Z. Hu, R. Salakhutdinov, E. P. Xing. Deep Kernel
    Learning. International Conference on Artificial Intelligence and Statistics, 2016.
"""

from __future__ import annotations

import torch
from gpytorch.kernels import Kernel
from torch import Tensor, nn

from streamgp.utils.validation import check_count, check_tensor


class LearnedProjection(nn.Module):
    r"""``h(x) = tanh(BatchNorm(x P^T + c))``: a learned map ``R^d -> (-1, 1)^k``.

    Args:
        input_dim: ``d``, the input dimension.
        output_dim: ``k``, the feature dimension (default 2, as in the paper).

    Example:
        >>> projection = LearnedProjection(8).double()
        >>> X = 2 * torch.rand(50, 8, dtype=torch.float64) - 1
        >>> features = projection(X)  # training mode: batch statistics
        >>> features.shape, bool(features.abs().max() < 1)
        (torch.Size([50, 2]), True)
        >>> _ = projection.calibrate(X).eval()  # streaming: running statistics
        >>> projection(X[:1]).shape
        torch.Size([1, 2])
    """

    def __init__(self, input_dim: int, output_dim: int = 2) -> None:
        check_count(input_dim, "input_dim", minimum=1)
        check_count(output_dim, "output_dim", minimum=1)
        super().__init__()
        self.input_dim = input_dim
        self.output_dim = output_dim
        self.linear = nn.Linear(input_dim, output_dim)
        self.batch_norm = nn.BatchNorm1d(output_dim)

    def forward(self, X: Tensor) -> Tensor:
        r"""Features of ``n x d`` inputs ``X``: an ``n x k`` tensor in ``(-1, 1)``."""
        check_tensor(X, "X", min_dim=2, last_dim=self.input_dim)
        if X.dim() != 2:
            raise ValueError(f"X must have shape n x d, got {tuple(X.shape)}.")
        if self.training and len(X) < 2:
            raise ValueError(
                "In training mode batch normalisation needs at least 2 rows; call .eval() "
                "to project single points with the running statistics."
            )
        return torch.tanh(self.batch_norm(self.linear(X)))

    @torch.no_grad()
    def calibrate(self, X: Tensor) -> LearnedProjection:
        r"""Set the batch-norm running statistics to those of the linear features of ``X``.

        Leaves the module in its current mode and every parameter unchanged.
        """
        check_tensor(X, "X", min_dim=2, last_dim=self.input_dim)
        if X.dim() != 2 or len(X) < 2:
            raise ValueError(f"X must have shape n x d with n >= 2, got {tuple(X.shape)}.")
        linear = self.linear(X)
        self.batch_norm.running_mean.copy_(linear.mean(0))
        self.batch_norm.running_var.copy_(linear.var(0, unbiased=True))
        return self


class ProjectedKernel(Kernel):
    r"""``k(x, x') = k_base(h(x), h(x'))``: a kernel on learned projected features.

    The projection's parameters are the kernel's, so a marginal likelihood trains
    them with the base kernel's hyperparameters (deep kernel learning). The
    projection follows the kernel's train/eval mode unless ``freeze_normalization``
    is set, which keeps its batch normalisation on the running statistics even in
    training mode (streaming: a single new point has no batch statistics, and the
    features of old points must not shift with each batch).

    Args:
        base_kernel: Kernel on the ``k``-dimensional features.
        projection: A :class:`LearnedProjection` ``R^d -> (-1, 1)^k``.

    Example:
        >>> from gpytorch.kernels import RBFKernel
        >>> projection = LearnedProjection(5).double()
        >>> kernel = ProjectedKernel(RBFKernel(ard_num_dims=2), projection).double()
        >>> X = torch.rand(10, 5, dtype=torch.float64)
        >>> kernel(X).to_dense().shape
        torch.Size([10, 10])
    """

    def __init__(self, base_kernel: Kernel, projection: LearnedProjection) -> None:
        if not isinstance(projection, LearnedProjection):
            raise TypeError(
                f"projection must be a LearnedProjection, got {type(projection).__name__}."
            )
        super().__init__(batch_shape=base_kernel.batch_shape)
        self.base_kernel = base_kernel
        self.projection = projection
        self.freeze_normalization = False

    def train(self, mode: bool = True) -> ProjectedKernel:
        super().train(mode)
        if self.freeze_normalization:
            self.projection.eval()
        return self

    def _features(self, X: Tensor) -> Tensor:
        # LearnedProjection takes n x d; batched model inputs are flattened around it.
        return self.projection(X.reshape(-1, X.shape[-1])).reshape(
            *X.shape[:-1], self.projection.output_dim
        )

    def forward(self, x1: Tensor, x2: Tensor, diag: bool = False, **params) -> Tensor:
        features1 = self._features(x1)
        features2 = features1 if x2 is x1 else self._features(x2)
        return self.base_kernel.forward(features1, features2, diag=diag, **params)
