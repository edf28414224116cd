r"""Targets and test metrics of the streaming protocol.

Regression reports the RMSE and the mean Gaussian negative log predictive density;
classification (Dirichlet GP classification, Milios et al. 2018) turns labels into one
regression target per class (:func:`dirichlet_targets`), averages ``softmax(f)`` over
draws of the per-class latent posteriors (:func:`dirichlet_probabilities`) and reports
accuracy and the mean negative log probability of the true class.

References:

.. [Milios2018] D. Milios, R. Camoriano, P. Michiardi, L. Rosasco, M. Filippone.
    Dirichlet-based Gaussian Processes for Large-scale Calibrated Classification.
    Advances in Neural Information Processing Systems 31, 2018.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from streamgp.utils.validation import check_count


def dirichlet_targets(
    labels: Tensor, num_classes: int, alpha_epsilon: float = 0.01
) -> tuple[Tensor, Tensor]:
    r"""Dirichlet-GP regression targets and fixed noise variances (Milios et al. 2018).

    With ``alpha_ic = alpha_epsilon + 1[label_i = c]``,
    ``sigma2_ic = log(1 + 1 / alpha_ic)`` and ``y_ic = log(alpha_ic) - sigma2_ic / 2``
    (the moments of a lognormal matching a Gamma(``alpha_ic``, 1) variable).

    Args:
        labels: ``n`` integer labels in ``0 .. num_classes - 1`` (a floating tensor
            with integer values is accepted; its dtype sets the outputs' dtype).
        num_classes: Number of classes ``C >= 2``.
        alpha_epsilon: The Dirichlet concentration of the other classes (``> 0``).

    Returns:
        ``(targets, noise_variances)``, both ``n x C``.

    Example:
        >>> y, s2 = dirichlet_targets(torch.tensor([0.0, 1.0]), 2)
        >>> torch.allclose(s2[0], torch.tensor([math.log(1 + 1 / 1.01), math.log(101.0)]))
        True
    """
    check_count(num_classes, "num_classes", minimum=2)
    if not isinstance(alpha_epsilon, (int, float)) or not alpha_epsilon > 0:
        raise ValueError(f"alpha_epsilon must be a positive number, got {alpha_epsilon!r}.")
    if not isinstance(labels, Tensor) or labels.dim() != 1:
        raise ValueError("labels must be a 1-d tensor of class indices.")
    index = labels.long()
    if (index != labels).any() or (index < 0).any() or (index >= num_classes).any():
        raise ValueError(f"labels must be integers in [0, {num_classes - 1}].")
    dtype = labels.dtype if labels.is_floating_point() else torch.get_default_dtype()
    onehot = torch.nn.functional.one_hot(index, num_classes).to(dtype)
    alpha = onehot + alpha_epsilon
    noise = torch.log1p(alpha.reciprocal())
    return alpha.log() - noise / 2, noise


def regression_metrics(mean: Tensor, variance: Tensor, Y: Tensor) -> dict[str, float]:
    r"""Test RMSE and mean Gaussian NLL (``n x 1`` predictive moments, targets)."""
    error = mean - Y
    variance = variance.clamp_min(1e-12)
    nll = 0.5 * (math.log(2 * math.pi) + variance.log() + error**2 / variance)
    return {"test_rmse": error.pow(2).mean().sqrt().item(), "test_nll": nll.mean().item()}


def dirichlet_probabilities(mean: Tensor, variance: Tensor, num_samples: int) -> Tensor:
    r"""``E[softmax(f)]`` over ``f_c ~ N(mean_c, variance_c)`` by Monte Carlo (``n x C``)."""
    draws = mean + variance.clamp_min(0).sqrt() * torch.randn(
        num_samples, *mean.shape, dtype=mean.dtype, device=mean.device
    )
    return draws.softmax(-1).mean(0)


def classification_metrics(probabilities: Tensor, labels: Tensor) -> dict[str, float]:
    r"""Accuracy and mean negative log probability of the true class."""
    index = labels.long()
    true = probabilities.gather(-1, index.unsqueeze(-1)).squeeze(-1)
    return {
        "test_accuracy": (probabilities.argmax(-1) == index).double().mean().item(),
        "test_nll": -true.clamp_min(1e-12).log().mean().item(),
    }
