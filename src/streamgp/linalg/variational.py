r"""Gaussian algebra shared by the streaming variational models.

Three pieces of math that the streaming sparse variational GP (Bui, Nguyen & Turner,
"Streaming Sparse Gaussian Process Approximations", NeurIPS 2017) and online
variational conditioning (Maddox, Stanton & Wilson, "Conditioning Sparse Variational
Gaussian Processes for Online Decision-Making", NeurIPS 2021) are built from:

- :func:`gaussian_cross_entropy` and :func:`streaming_kl_correction`: the two extra
  KL terms of the uncollapsed streaming bound. Their difference
  ``KL(q || q_old) - KL(q || p_old)`` equals ``E_q[log p_old(a) - log q_old(a)]``,
  a difference of cross entropies in which the entropy of ``q(a)`` cancels. This
  keeps the objective finite when ``q(a)`` is singular (more old inducing points
  than new ones, or coinciding points).
- :func:`condition_on_noisy_observations`: the exact Gaussian update of a joint
  Gaussian over ``(f_observed, f_rest)`` after observing ``f_observed + noise``.
  Applied to the joint variational predictive ``q(f)``, this is exactly online
  variational conditioning: OVC's pseudo-point exact GP (Maddox et al., Eq. 5)
  predicts ``q(f_rest | y)``, and computing it from the joint avoids forming the
  pseudo-noise ``(S^-1 - K^-1)^-1``, which is unbounded where ``q(u)`` equals the
  prior.
- :func:`whiten_gaussian`: the whitened parameters ``(L^-1 (mu - mean), L^-1 S L^-T)``
  of a Gaussian over inducing values, used to warm-start ``q(u)`` on a new inducing set.
- :func:`optimal_whitened_posterior`: with a Gaussian likelihood, the ``q(v)`` that
  maximises the (beta-weighted) streaming bound in closed form. At that ``q`` the bound
  is the collapsed bound (Titsias 2009 for one batch, Bui et al. 2017 for a stream), so
  the hyperparameters can be fitted by quasi-Newton steps on it, as an exact GP's are.
"""

from __future__ import annotations

import math

import torch
from linear_operator.utils.cholesky import psd_safe_cholesky
from torch import Tensor


def _logdet_from_root(root: Tensor) -> Tensor:
    r"""``log |R R^T|`` for a triangular root ``R`` (diagonal entries may be negative)."""
    return 2.0 * root.diagonal(dim1=-2, dim2=-1).abs().log().sum(-1)


def gaussian_cross_entropy(
    mean: Tensor, covar: Tensor, target_mean: Tensor, target_root: Tensor
) -> Tensor:
    r"""Cross entropy ``E_{N(mean, covar)}[-log N(x; target_mean, R R^T)]``.

    Args:
        mean: ``batch x m`` mean of the Gaussian the expectation is taken under.
        covar: ``batch x m x m`` covariance of that Gaussian (may be singular).
        target_mean: ``batch x m`` mean of the target density.
        target_root: ``batch x m x m`` lower-triangular root ``R`` of the target
            covariance (a Cholesky factor, or a product of Cholesky factors).

    Returns:
        A ``batch``-shaped tensor:
        ``1/2 [tr(P^-1 covar) + d^T P^-1 d + log|P| + m log 2 pi]`` with
        ``P = R R^T`` and ``d = mean - target_mean``.
    """
    m = mean.shape[-1]
    half_covar = torch.linalg.solve_triangular(target_root, covar, upper=False)
    whitened_covar = torch.linalg.solve_triangular(target_root, half_covar.mT, upper=False)
    trace = whitened_covar.diagonal(dim1=-2, dim2=-1).sum(-1)
    diff = (mean - target_mean).unsqueeze(-1)
    maha = torch.linalg.solve_triangular(target_root, diff, upper=False).pow(2).sum((-2, -1))
    return 0.5 * (trace + maha + _logdet_from_root(target_root) + m * math.log(2 * math.pi))


def streaming_kl_correction(
    mean: Tensor,
    covar: Tensor,
    old_mean: Tensor,
    old_root: Tensor,
    old_prior_mean: Tensor,
    old_prior_root: Tensor,
) -> Tensor:
    r"""``KL(q(a) || q_old(a)) - KL(q(a) || p(a | theta_old))`` of the streaming bound.

    Equal to ``E_q[log p_old(a) - log q_old(a)]`` (Bui et al. 2017, Eq. 6 and
    appendix), computed as a difference of cross entropies so that ``q(a)`` may be
    singular.

    Args:
        mean: ``m_a`` mean of the new approximate posterior at the old inducing points.
        covar: ``m_a x m_a`` covariance of that marginal.
        old_mean: Mean of the old approximate posterior ``q_old(a)``.
        old_root: Lower-triangular root of the covariance of ``q_old(a)``.
        old_prior_mean: Prior mean at ``a`` under the old hyperparameters.
        old_prior_root: Lower-triangular root of ``K_aa`` under the old hyperparameters.

    Returns:
        The scalar (or batch) correction term.
    """
    return gaussian_cross_entropy(mean, covar, old_mean, old_root) - gaussian_cross_entropy(
        mean, covar, old_prior_mean, old_prior_root
    )


def condition_on_noisy_observations(
    mean: Tensor, covar: Tensor, num_observed: int, targets: Tensor, noise: Tensor
) -> tuple[Tensor, Tensor]:
    r"""Condition a joint Gaussian on noisy observations of its first entries.

    With ``f = (f_o, f_r) ~ N(mean, covar)`` and ``y = f_o + e``, ``e ~ N(0, diag(noise))``,
    returns the mean and covariance of ``f_r | y``:
    ``mean_r + C_ro A^-1 (y - mean_o)`` and ``C_rr - C_ro A^-1 C_or``, ``A = C_oo + diag(noise)``.

    The covariance depends only on the inputs; ``targets`` may carry extra leading
    batch dimensions (fantasy samples), which broadcast against the mean.

    Args:
        mean: ``batch x (o + r)`` joint mean.
        covar: ``batch x (o + r) x (o + r)`` joint covariance.
        num_observed: ``o``, the number of leading entries that are observed.
        targets: ``sample x batch x o`` observations.
        noise: ``batch x o`` (broadcastable) observation noise variances.

    Returns:
        ``(mean_r, covar_r)`` of shapes ``broadcast(sample x batch) x r`` and
        ``batch x r x r``.
    """
    o = num_observed
    C_oo = covar[..., :o, :o] + torch.diag_embed(noise.expand(covar.shape[:-2] + (o,)))
    C_or = covar[..., :o, o:]
    L = psd_safe_cholesky(C_oo)
    half_cross = torch.linalg.solve_triangular(L, C_or, upper=False)  # L^-1 C_or
    covar_r = covar[..., o:, o:] - half_cross.mT @ half_cross
    residual = (targets - mean[..., :o]).unsqueeze(-1)
    half_residual = torch.linalg.solve_triangular(L, residual, upper=False)
    mean_r = mean[..., o:] + (half_cross.mT @ half_residual).squeeze(-1)
    return mean_r, covar_r


def whiten_gaussian(
    mean: Tensor, covar: Tensor, prior_mean: Tensor, prior_root: Tensor
) -> tuple[Tensor, Tensor]:
    r"""Whitened parameters of ``N(mean, covar)`` relative to ``N(prior_mean, L L^T)``.

    Returns ``m_w = L^-1 (mean - prior_mean)`` and a Cholesky factor of
    ``S_w = L^-1 covar L^-T`` (with jitter if needed), the parametrisation of
    gpytorch's whitened ``VariationalStrategy``.
    """
    m_w = torch.linalg.solve_triangular(
        prior_root, (mean - prior_mean).unsqueeze(-1), upper=False
    ).squeeze(-1)
    half = torch.linalg.solve_triangular(prior_root, covar, upper=False)
    S_w = torch.linalg.solve_triangular(prior_root, half.mT, upper=False)
    S_w = 0.5 * (S_w + S_w.mT)
    return m_w, psd_safe_cholesky(S_w)


def optimal_whitened_posterior(
    weights: Tensor,
    residual: Tensor,
    noise: Tensor,
    beta: float,
    old: tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor] | None = None,
) -> tuple[Tensor, Tensor]:
    r"""The whitened ``q(v) = N(m, R R^T)`` maximising the streaming bound, Gaussian likelihood.

    With ``u = mu_Z + L v`` (``L L^T = K_ZZ``), ``v ~ N(0, I)`` a priori, the data enter
    through ``f_X = mu_X + W v + (independent of v)``, ``W = K_XZ L^-T``, and the old
    inducing values through ``a = mu_a + W_a v + ...``. The objective of
    :class:`~streamgp.models.OnlineSVGP`,

    .. math::

        \sum_i \mathbb{E}_q \log N(y_i \mid f_i, \sigma^2) - \beta \big[
        \mathrm{KL}(q(v) \| N(0, I))
        + \mathbb{E}_q \log \frac{p(a \mid \theta_{old})}{q_{old}(a)} \big],

    divided by ``beta`` is ``E_q[log t(v)] - KL(q || N(0, I))`` for a Gaussian factor
    ``t``, so its maximiser is ``N(P^-1 eta, P^-1)`` with

    .. math::

        P = I + \frac{W^T W}{\beta \sigma^2} + W_a^T (S_{old}^{-1} - K_{old}^{-1}) W_a,
        \quad \eta = \frac{W^T r}{\beta \sigma^2}
        + W_a^T [S_{old}^{-1} (m_{old} - \mu_a) - K_{old}^{-1} (\mu_{old} - \mu_a)],

    ``r = y - mu_X`` (Bui et al. 2017, section 3.1, with the tempered likelihood of the
    generalized-VI weight). ``beta = 1`` and no old posterior give Titsias' optimum.

    Args:
        weights: ``n x M`` whitened cross-covariance ``W = K_XZ L^-T`` of the batch.
        residual: ``n`` targets minus the prior mean, ``r``.
        noise: Scalar noise variance ``sigma^2``.
        beta: The weight of the KL terms.
        old: ``(W_a, mu_a, m_old, R_old, mu_old, L_old)``: the whitened cross-covariance
            ``K_aZ L^-T`` of the old inducing points ``a``, the current prior mean at
            ``a``, the old posterior's mean and lower root, the old prior mean and the
            Cholesky factor of the old ``K_aa``; None before the first batch.

    Returns:
        ``(m, R)``: the mean and a lower-triangular root of the covariance of ``q(v)``.

    Raises:
        torch.linalg.LinAlgError: if ``P`` is not positive definite (an old posterior
            wider than its prior in some direction), where the bound has no maximiser.
    """
    scale = 1.0 / (beta * noise)
    precision = scale * (weights.mT @ weights)
    eta = scale * (weights.mT @ residual.unsqueeze(-1)).squeeze(-1)
    if old is not None:
        W_a, mu_a, old_mean, old_root, old_prior_mean, old_prior_root = old
        posterior_solve = torch.cholesky_solve(W_a, old_root)  # S_old^-1 W_a
        prior_solve = torch.cholesky_solve(W_a, old_prior_root)  # K_old^-1 W_a
        precision = precision + W_a.mT @ (posterior_solve - prior_solve)
        eta = (
            eta + posterior_solve.mT @ (old_mean - mu_a) - prior_solve.mT @ (old_prior_mean - mu_a)
        )
    eye = torch.eye(precision.shape[-1], dtype=precision.dtype, device=precision.device)
    precision = eye + 0.5 * (precision + precision.mT)
    mean = torch.cholesky_solve(eta.unsqueeze(-1), torch.linalg.cholesky(precision)).squeeze(-1)
    # A lower root of P^-1 without factorising P^-1 (tiny eigenvalues when beta * noise is
    # small): with J the reversal, J P J = C C^T gives P^-1 = (J C^-T J)(J C^-T J)^T, and
    # J C^-T J is lower triangular.
    C = torch.linalg.cholesky(precision.flip(-2, -1))
    C_inv = torch.linalg.solve_triangular(C, eye, upper=False)
    return mean, C_inv.mT.flip(-2, -1)
