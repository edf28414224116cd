"""LOVE roots (streamgp.linalg.love) against dense float64 linear algebra."""

from __future__ import annotations

import pytest
import torch

from streamgp.linalg import love
from streamgp.linalg.love import (
    _cholesky_qr,
    block_lanczos,
    block_lanczos_root,
    lanczos,
    lanczos_root,
    nystrom_root,
    sample_with_root,
)

DTYPE = torch.float64


def psd_matrix(m: int, decay: float, rank: int | None = None) -> torch.Tensor:
    """Random PSD matrix with geometrically decaying spectrum (optionally low rank)."""
    cols = m if rank is None else rank
    L = torch.randn(m, cols, dtype=DTYPE) * decay ** torch.arange(cols, dtype=DTYPE)
    return L @ L.T


def gp_posterior_covariance(m: int = 120) -> torch.Tensor:
    """Dense exact-GP posterior covariance on a 1-D grid (RBF, m/3 noisy observations)."""
    x = torch.linspace(0, 1, m, dtype=DTYPE)
    K = torch.exp(-0.5 * (x[:, None] - x[None, :]) ** 2 / 0.1**2)
    idx = torch.randperm(m)[: m // 3]
    Kxx = K[idx][:, idx] + 0.01 * torch.eye(len(idx), dtype=DTYPE)
    Ksx = K[:, idx]
    return K - Ksx @ torch.linalg.solve(Kxx, Ksx.T)


def matvec_of(M: torch.Tensor):
    return lambda v: (M @ v.unsqueeze(-1)).squeeze(-1)


@pytest.mark.parametrize("decay", [0.7, 0.97])
def test_lanczos_relation_and_orthogonality(decay):
    M = psd_matrix(80, decay)
    dec = lanczos(matvec_of(M), torch.randn(80, dtype=DTYPE), 30)
    Q, T = dec.basis, dec.tridiagonal()
    assert Q.shape == (80, 30) and T.shape == (30, 30)
    assert (Q.T @ Q - torch.eye(30, dtype=DTYPE)).abs().max() < 1e-13
    assert (Q.T @ M @ Q - T).abs().max() < 1e-12 * M.abs().max()
    # M Q = Q T + beta_k q_{k+1} e_k^T
    residual = M @ Q - Q @ T
    expected = dec.off_diagonal[-1] * dec.next_vector
    assert (residual[:, :-1]).abs().max() < 1e-12 * M.abs().max()
    assert (residual[:, -1] - expected).abs().max() < 1e-12 * M.abs().max()


def test_lanczos_batched_equals_individual_runs():
    Ms = torch.stack([psd_matrix(40, 0.9), psd_matrix(40, 0.6)])
    init = torch.randn(2, 40, dtype=DTYPE)
    batched = lanczos(matvec_of(Ms), init, 12)
    for i in range(2):
        single = lanczos(matvec_of(Ms[i]), init[i], 12)
        assert torch.allclose(batched.tridiagonal()[i], single.tridiagonal(), atol=1e-10)
        assert torch.allclose(batched.basis[i], single.basis, atol=1e-10)


@pytest.mark.parametrize(
    "M",
    [psd_matrix(60, 0.9), psd_matrix(60, 1.0), psd_matrix(60, 0.9, rank=7)],
    ids=["decaying", "flat", "rank7"],
)
def test_full_rank_root_reproduces_dense(M):
    """k = m (tol = 0): the root reproduces M to round-off, also with restarts."""
    res = lanczos_root(matvec_of(M), M.trace(), 60, tol=0.0)
    assert (res.root @ res.root.T - M).abs().max() < 1e-12 * M.abs().max()
    assert res.residual_trace < 1e-12 * M.trace()


@pytest.mark.parametrize("tol", [1e-3, 1e-6, 1e-10])
def test_adaptive_rank_meets_tolerance_and_is_one_sided(tol):
    M = gp_posterior_covariance()
    exact_var = M.diagonal()
    res = lanczos_root(matvec_of(M), M.trace(), M.shape[0], tol=tol)
    assert res.rank < M.shape[0]
    assert res.residual_trace <= tol * M.trace()
    # Nystrom: the residual is PSD, so variances are never above the exact ones
    # (nor negative), and the gap is bounded by the residual trace.
    residual = M - res.root @ res.root.T
    assert torch.linalg.eigvalsh(residual).min() > -1e-12 * M.abs().max()
    love_var = res.root.square().sum(-1)
    assert (love_var >= 0).all()
    assert (love_var <= exact_var + 1e-12).all()
    assert (exact_var - love_var).max() <= res.residual_trace + 1e-12


def test_smaller_tolerance_needs_larger_rank():
    M = gp_posterior_covariance()
    ranks = [lanczos_root(matvec_of(M), M.trace(), 120, tol=t).rank for t in (1e-2, 1e-6, 1e-12)]
    assert ranks[0] < ranks[1] < ranks[2]


def test_max_rank_caps_and_certificate_reports_the_gap():
    M = psd_matrix(50, 0.98)
    res = lanczos_root(matvec_of(M), M.trace(), 50, tol=0.0, max_rank=5)
    assert res.rank == 5
    assert torch.allclose(res.residual_trace, M.trace() - res.root.square().sum(), rtol=1e-12)
    assert res.residual_trace > 0


def test_batched_root_meets_tolerance_for_every_member():
    Ms = torch.stack([gp_posterior_covariance(), psd_matrix(120, 0.8, rank=10)])
    traces = Ms.diagonal(dim1=-2, dim2=-1).sum(-1)
    res = lanczos_root(matvec_of(Ms), traces, 120, tol=1e-8)
    assert res.root.shape[:2] == (2, 120)
    assert (res.residual_trace <= 1e-8 * traces).all()
    assert torch.allclose(res.residual_trace, traces - res.root.square().sum((-2, -1)))


def test_nystrom_root_equals_explicit_formula():
    M = psd_matrix(30, 0.9)
    dec = lanczos(matvec_of(M), torch.randn(30, dtype=DTYPE), 8)
    R = nystrom_root(dec)
    Q = dec.basis
    explicit = M @ Q @ torch.linalg.solve(Q.T @ M @ Q, Q.T @ M)
    assert (R @ R.T - explicit).abs().max() < 1e-10 * M.abs().max()


def test_sample_with_root_has_the_root_covariance():
    M = gp_posterior_covariance(30)
    root = lanczos_root(matvec_of(M), M.trace(), 30, tol=1e-10).root
    mean = torch.randn(30, dtype=DTYPE)
    z = torch.randn(200_000, root.shape[-1], dtype=DTYPE)
    samples = sample_with_root(mean, root, z)
    assert samples.shape == (200_000, 30)
    centered = samples - mean
    empirical = centered.T @ centered / len(z)
    assert (empirical - M).abs().max() < 0.02 * M.abs().max()
    assert (samples.mean(0) - mean).abs().max() < 0.01
    with pytest.raises(ValueError, match="base_samples"):
        sample_with_root(mean, root, torch.randn(4, root.shape[-1] + 1, dtype=DTYPE))


def test_invalid_arguments_raise():
    M = psd_matrix(10, 0.9)
    with pytest.raises(ValueError, match="tol"):
        lanczos_root(matvec_of(M), M.trace(), 10, tol=1.5)
    with pytest.raises(ValueError, match="max_rank"):
        lanczos_root(matvec_of(M), M.trace(), 10, max_rank=0)
    with pytest.raises(ValueError, match="num_steps"):
        lanczos(matvec_of(M), torch.randn(10, dtype=DTYPE), 0)
    with pytest.raises(ValueError, match="init"):
        lanczos(matvec_of(M), torch.randn(0, dtype=DTYPE), 3)


def test_float32_root_is_accurate_to_its_precision():
    M = gp_posterior_covariance(60).float()
    res = lanczos_root(matvec_of(M), M.trace(), 60, tol=1e-4)
    assert res.root.dtype == torch.float32
    assert (res.root @ res.root.T - M).abs().max() < 1e-3 * M.abs().max()


def _block_cases():
    """(M, tol, max_rank, block_size): adaptive, full rank, rank cap inside a block,
    and a rank-deficient operator (invariant subspaces: restarts, dropped directions)."""
    torch.manual_seed(3)
    return [
        (psd_matrix(256, 0.9), 1e-8, None, 8),
        (psd_matrix(256, 0.97), 0.0, None, 8),
        (psd_matrix(256, 0.97), 1e-12, 45, 8),
        (psd_matrix(256, 0.9, rank=20), 0.0, None, 8),
        (gp_posterior_covariance(256), 1e-10, None, 8),
    ]


@pytest.mark.parametrize("case", range(5))
def test_block_lanczos_relation_without_stored_products(case):
    """M Q = Q H + N J with Q orthonormal and Q^T N = 0: H and N stand in for M Q."""
    M, tol, max_rank, block_size = _block_cases()[case]
    dec = block_lanczos(
        lambda V: M @ V, M.trace(), M.shape[0], tol=tol, max_rank=max_rank, block_size=block_size
    )
    Q, H, N, J = dec.basis, dec.coefficients, dec.remainder, dec.remainder_coefficients
    k = dec.rank
    scale = torch.linalg.matrix_norm(M, ord=2)
    assert max_rank is None or k <= max_rank
    # A converged run's nearly dependent blocks cost some orthogonality (as in any
    # re-orthogonalised Lanczos): 1e-10 is the round-off the LOVE tests allow.
    assert torch.allclose(Q.T @ Q, torch.eye(k, dtype=DTYPE), atol=1e-10)
    assert (Q.T @ N).abs().max() <= 1e-12 * scale
    assert (M @ Q - Q @ H - N @ J).abs().max() <= 1e-12 * scale  # exact, whatever Q is
    assert (Q.T @ M @ Q - H).abs().max() <= 1e-10 * scale


def test_block_lanczos_reads_the_default_block_size_at_call_time(monkeypatch):
    """Overriding ``love.DEFAULT_BLOCK_SIZE`` (as streamgp.settings says) takes effect:
    the first block, hence the rank of a one-block run, follows it."""
    M = psd_matrix(512, 0.9)
    widths = []

    def matmul(V):
        widths.append(V.shape[-1])
        return M @ V

    for block_size in (4, 16):
        monkeypatch.setattr(love, "DEFAULT_BLOCK_SIZE", block_size)
        widths.clear()
        block_lanczos(matmul, M.trace(), 512, tol=0.5)
        assert widths[0] == block_size


@pytest.mark.parametrize("case", range(5))
def test_block_lanczos_root_is_the_nystrom_root_of_its_basis(case):
    """The Nystrom root of the basis: R R^T <= M, equal to M on span(Q) and in M Q's
    range (``R R^T Q = M Q``), from dense products with the basis (no H, no N)."""
    M, tol, max_rank, block_size = _block_cases()[case]
    res = block_lanczos_root(
        lambda V: M @ V, M.trace(), M.shape[0], tol=tol, max_rank=max_rank, block_size=block_size
    )
    Q = block_lanczos(
        lambda V: M @ V, M.trace(), M.shape[0], tol=tol, max_rank=max_rank, block_size=block_size
    ).basis
    R = res.root
    scale = torch.linalg.matrix_norm(M, ord=2)
    assert (R @ (R.T @ Q) - M @ Q).abs().max() <= 1e-9 * scale
    assert torch.linalg.eigvalsh(M - R @ R.T).min() >= -1e-10 * scale
    assert torch.allclose(res.residual_trace, (M.trace() - R.square().sum()).clamp_min(0.0))
    if tol > 0 and max_rank is None:
        assert res.residual_trace <= tol * M.trace()
    if tol == 0 and max_rank is None:
        assert (R @ R.T - M).abs().max() <= 1e-9 * scale


def test_cholesky_qr_factors_well_conditioned_blocks_and_flags_the_rest():
    """CholeskyQR2: V = R^T Q with orthonormal rows Q and upper-triangular R, trusted
    while V is far from rank deficient; nearly dependent or rank-deficient blocks are
    flagged (the caller then uses Householder QR)."""
    torch.manual_seed(0)
    V = torch.randn(8, 500, dtype=DTYPE) * torch.logspace(0, -3, 8, dtype=DTYPE)[:, None]
    Q, R, trusted = _cholesky_qr(V)
    assert bool(trusted)
    assert torch.allclose(Q @ Q.T, torch.eye(8, dtype=DTYPE), atol=1e-14)
    assert torch.equal(R, R.triu())
    assert torch.allclose(R.T @ Q, V, atol=1e-14)
    householder = torch.linalg.qr(V.T).R
    assert torch.allclose(R.diagonal(), householder.diagonal().abs(), rtol=1e-12)
    nearly = V.clone()
    nearly[-1] = nearly[0] + 1e-9 * torch.randn(500, dtype=DTYPE)
    assert not bool(_cholesky_qr(nearly)[2])
    deficient = V.clone()
    deficient[-1] = 0.0
    assert not bool(_cholesky_qr(deficient)[2])
    # Kahan's matrix: a harmless-looking diagonal, condition number ~1e13.
    kahan = torch.eye(64, dtype=DTYPE) - 0.7 * torch.ones(64, 64, dtype=DTYPE).triu(1)
    basis = torch.linalg.qr(torch.randn(500, 64, dtype=DTYPE)).Q
    assert not bool(_cholesky_qr(kahan.T @ basis.T)[2])


@pytest.mark.parametrize("case", range(5))
def test_block_lanczos_cholesky_qr_gives_the_householder_decomposition(case, monkeypatch):
    """The fast (CholeskyQR2) next blocks give the decomposition that Householder QR
    of every block gives: the same root and certificate, to round-off."""
    M, tol, max_rank, block_size = _block_cases()[case]

    def run():
        return block_lanczos_root(
            lambda V: M @ V,
            M.trace(),
            M.shape[0],
            tol=tol,
            max_rank=max_rank,
            block_size=block_size,
        )

    fast = run()
    untrusted = _cholesky_qr(torch.eye(2, 3, dtype=DTYPE))[2] & False
    monkeypatch.setattr(love, "_cholesky_qr", lambda rows: (rows, rows, untrusted))
    householder = run()
    scale = torch.linalg.matrix_norm(M, ord=2)
    assert fast.root.shape == householder.root.shape
    assert (fast.root @ fast.root.T - householder.root @ householder.root.T).abs().max() <= (
        1e-9 * scale
    )
    assert abs(float(fast.residual_trace - householder.residual_trace)) <= 1e-9 * float(M.trace())


def test_cached_start_vectors_do_not_break_a_later_differentiable_call():
    """The first call for a shape under inference_mode caches the start vector: a later
    differentiable lanczos_root through the same shape still has a gradient."""
    torch.manual_seed(0)
    size = 253  # a shape no other test uses, so the first call here fills the cache
    A = torch.randn(size, size, dtype=DTYPE)
    M = A @ A.T / size
    with torch.inference_mode():
        lanczos_root(lambda v: v @ M, M.trace(), size, tol=1e-6)
    w = torch.tensor(2.0, dtype=DTYPE, requires_grad=True)
    root = lanczos_root(lambda v: v @ (w * M), (2.0 * M).trace(), size, tol=1e-6).root
    (gradient,) = torch.autograd.grad(root.sum(), w)
    assert torch.isfinite(gradient) and gradient.abs() > 0
