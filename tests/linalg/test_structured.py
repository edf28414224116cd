"""Structured (Kronecker root + sparse statistic) LOVE grid posterior against dense SKI.

The oracle is the textbook SKI posterior of the grid values with dense solves,
``Sigma_U = K - K W^T (W K W^T + Lambda)^{-1} W K`` and
``alpha = K W^T (W K W^T + Lambda)^{-1} y``, with ``K`` evaluated by the kernel on all
grid points (no jitter, no Kronecker structure, no Lanczos). The documented error
(module docstring of :mod:`streamgp.linalg.structured`) is two-sided: for every ``w``,

``-|w|^2 residual_trace <= w^T (R R^T - Sigma_U) w <= whitened_residual * w^T K w``,

and the certificates themselves are checked against dense traces.
"""

import math

import pytest
import torch
from gpytorch.kernels import MaternKernel, RBFKernel, ScaleKernel
from oracles import rel_err

from streamgp.interpolation import CubicGridInterpolation
from streamgp.linalg import (
    GridKernelRoot,
    grid_kernel_matrix,
    grid_kernel_root,
    log_marginal_likelihood,
)
from streamgp.linalg.structured import (
    WhitenedStatistic,
    conjugate_gradients,
    structured_grid_posterior,
    structured_log_marginal_likelihood,
)

DTYPE = torch.float64


def setup(d=2, g=8, n=40, kind="rbf"):
    interp = CubicGridInterpolation(torch.stack([torch.zeros(d), torch.ones(d)]).to(DTYPE), g)
    base = RBFKernel(ard_num_dims=d) if kind == "rbf" else MaternKernel(2.5, ard_num_dims=d)
    kernel = ScaleKernel(base).to(DTYPE)
    base.lengthscale = torch.tensor([0.3, 0.5, 0.4][:d], dtype=DTYPE)
    kernel.outputscale = 1.7
    X = torch.rand(n, d, dtype=DTYPE)
    y = torch.sin(4 * X).sum(-1) + 0.1 * torch.randn(n, dtype=DTYPE)
    noise = 0.02 + 0.05 * torch.rand(n, dtype=DTYPE)
    return interp, kernel, X, y, noise


def dense_ski_posterior(K, W, y, noise):
    """Dense SKI posterior of the grid values (plain solves, no structure)."""
    gram = W @ K @ W.T + torch.diag(noise)
    cross = K @ W.T
    mean = cross @ torch.linalg.solve(gram, y)
    cov = K - cross @ torch.linalg.solve(gram, cross.T)
    return mean, 0.5 * (cov + cov.T)


def statistics(interp, X, y, noise, sparse=True):
    W = interp.weights(X)
    A = W.weighted_gram(noise.reciprocal(), sparse=sparse)
    b = W.t_matvec(y / noise)
    return W, A, b


def assert_certified(post, K, cov, probes, slack=1e-9):
    """The two-sided LOVE bound of the module docs, for every probe column ``w``."""
    R = post.posterior.root
    err = ((R.T @ probes).square().sum(0)) - (probes * (cov @ probes)).sum(0)
    prior = (probes * (K @ probes)).sum(0)
    norm2 = probes.square().sum(0)
    upper = post.whitened_residual * prior + slack * prior
    lower = -(post.residual_trace * norm2 + slack * prior)
    assert (err <= upper).all(), (err - upper).max()
    assert (err >= lower).all(), (lower - err).max()


@pytest.mark.parametrize("d,g", [(2, 8), (3, 5)])
def test_structured_posterior_matches_dense_ski_with_near_zero_tolerance(d, g):
    interp, kernel, X, y, noise = setup(d=d, g=g)
    with torch.no_grad():
        L_K = grid_kernel_root(kernel, interp.grid)
        assert len(L_K.factors) == d  # really the Kronecker path
        K = grid_kernel_matrix(kernel, interp.grid)
        W, A, b = statistics(interp, X, y, noise)
        assert A.is_sparse
        post = structured_grid_posterior(L_K, A, b, tol=1e-12)
        mean, cov = dense_ski_posterior(K, W.to_dense(), y, noise)
    R = post.posterior.root
    assert R.shape[0] == interp.num_grid and R.shape[1] <= interp.num_grid
    assert rel_err(post.posterior.mean, mean) < 1e-8
    assert rel_err(R @ R.T, cov) < 1e-7
    assert 0 <= post.whitened_residual <= 1e-11
    assert 0 <= post.residual_trace <= 1e-10 * torch.trace(cov)


@pytest.mark.parametrize("tol", [1e-3, 1e-6])
def test_love_root_is_within_its_certificate(tol):
    interp, kernel, X, y, noise = setup()
    with torch.no_grad():
        L_K = grid_kernel_root(kernel, interp.grid)
        K = grid_kernel_matrix(kernel, interp.grid)
        W, A, b = statistics(interp, X, y, noise)
        post = structured_grid_posterior(L_K, A, b, tol=tol)
        mean, cov = dense_ski_posterior(K, W.to_dense(), y, noise)
    m = interp.num_grid
    R = post.posterior.root
    assert R.shape[1] < m  # a genuinely low-rank root at this tolerance
    # Step 1 stops on an absolute gap tol; step 2 on tol * tr(Sigma_1).
    assert 0 <= post.whitened_residual <= tol
    trace_sigma1_max = torch.trace(cov) + post.whitened_residual * torch.trace(K)
    assert 0 <= post.residual_trace <= tol * trace_sigma1_max * (1 + 1e-9)
    # The reported residual is tr(Sigma_1) - |R|_F^2, and Sigma_U <= Sigma_1 <= Sigma_U + wr K.
    gap = post.residual_trace - (torch.trace(cov) - R.square().sum())
    assert -1e-9 <= gap <= post.whitened_residual * torch.trace(K) + 1e-9
    # Variances (unit vectors), random grid weights, and interpolation rows of test points.
    Ws = interp.weights(torch.rand(25, 2, dtype=DTYPE)).to_dense().T
    probes = torch.cat([torch.eye(m, dtype=DTYPE), torch.randn(m, 10, dtype=DTYPE), Ws], dim=1)
    assert_certified(post, K, cov, probes)
    # The mean is a CG solve, not a Lanczos approximation: accurate whatever tol is.
    assert rel_err(post.posterior.mean, mean) < 1e-8


@pytest.mark.parametrize("max_rank", [3, 6])
def test_rank_cap_keeps_an_honest_certificate(max_rank):
    interp, kernel, X, y, noise = setup(n=60)
    with torch.no_grad():
        L_K = grid_kernel_root(kernel, interp.grid)
        K = grid_kernel_matrix(kernel, interp.grid)
        W, A, b = statistics(interp, X, y, noise)
        post = structured_grid_posterior(L_K, A, b, tol=1e-10, max_rank=max_rank)
        mean, cov = dense_ski_posterior(K, W.to_dense(), y, noise)
        L = L_K.to_dense()
        G = L.T @ A.to_dense() @ L
    m = interp.num_grid
    assert post.posterior.root.shape[1] <= max_rank
    # No rank-k approximation below G (or Sigma_1 >= Sigma_U) misses less than the
    # tail of the spectrum (Weyl), so an honest certificate is at least that.
    tail_G = torch.linalg.eigvalsh(G).flip(0)[max_rank:].sum()
    tail_cov = torch.linalg.eigvalsh(cov).flip(0)[max_rank:].sum()
    assert post.whitened_residual >= tail_G * (1 - 1e-9)
    assert post.residual_trace >= tail_cov * (1 - 1e-9)
    probes = torch.cat([torch.eye(m, dtype=DTYPE), torch.randn(m, 10, dtype=DTYPE)], dim=1)
    assert_certified(post, K, cov, probes)
    assert rel_err(post.posterior.mean, mean) < 1e-8


def test_dense_statistic_and_non_separable_kernel_match_dense_ski():
    interp, kernel, X, y, noise = setup(kind="matern")
    with torch.no_grad():
        L_K = grid_kernel_root(kernel, interp.grid)
        assert len(L_K.factors) == 1  # dense root for Matern
        K = grid_kernel_matrix(kernel, interp.grid)
        W, A_sparse, b = statistics(interp, X, y, noise)
        A_dense = A_sparse.to_dense()
        sparse = structured_grid_posterior(L_K, A_sparse, b, tol=1e-12)
        dense = structured_grid_posterior(L_K, A_dense, b, tol=1e-12)
        mean, cov = dense_ski_posterior(K, W.to_dense(), y, noise)
    for post in (sparse, dense):
        R = post.posterior.root
        assert rel_err(post.posterior.mean, mean) < 1e-8
        assert rel_err(R @ R.T, cov) < 1e-7


@pytest.mark.parametrize("tol", [1e-8, 0.0])
def test_no_data_gives_the_prior(tol):
    interp, kernel, *_ = setup()
    m = interp.num_grid
    with torch.no_grad():
        L_K = grid_kernel_root(kernel, interp.grid)
        K = grid_kernel_matrix(kernel, interp.grid)
        empty = torch.sparse_coo_tensor(
            torch.zeros(2, 0, dtype=torch.long), torch.zeros(0, dtype=DTYPE), (m, m)
        ).coalesce()
        post = structured_grid_posterior(L_K, empty, torch.zeros(m, dtype=DTYPE), tol=tol)
    R = post.posterior.root
    assert torch.isfinite(R).all()
    assert torch.equal(post.posterior.mean, torch.zeros(m, dtype=DTYPE))
    assert post.whitened_residual == 0
    # Prior covariance up to the step-2 certificate (R R^T <= K, tr(K - R R^T) reported).
    diff = K - R @ R.T
    assert torch.linalg.eigvalsh(diff).min() > -1e-9
    assert abs(torch.trace(diff) - post.residual_trace) < 1e-9
    assert post.residual_trace <= max(tol, 1e-12) * torch.trace(K) * (1 + 1e-9)


def spd(n, cond=1e3):
    Q = torch.linalg.qr(torch.randn(n, n, dtype=DTYPE)).Q
    return (
        Q @ torch.diag(torch.logspace(0, torch.log10(torch.tensor(cond)).item(), n).to(DTYPE)) @ Q.T
    )


def test_conjugate_gradients_solves_columnwise():
    M = spd(30)
    rhs = torch.randn(30, 3, dtype=DTYPE)
    rhs[:, 1] = 0.0  # a zero column stays zero (and stops at once)
    x = conjugate_gradients(lambda V: M @ V, rhs, lambda V: V, 1e-12, 200)
    ref = torch.linalg.solve(M, rhs)
    assert torch.equal(x[:, 1], torch.zeros(30, dtype=DTYPE))
    assert rel_err(x, ref) < 1e-9
    # Exact preconditioner: one iteration solves it.
    M_inv = torch.linalg.inv(M)
    x1 = conjugate_gradients(lambda V: M @ V, rhs, lambda V: M_inv @ V, 1e-12, 1)
    assert rel_err(x1, ref) < 1e-9
    # No iterations: the zero start.
    assert torch.equal(
        conjugate_gradients(lambda V: M @ V, rhs, lambda V: V, 1e-12, 0), torch.zeros_like(rhs)
    )
    # Too few plain iterations on an ill-conditioned system do not solve it (the test can fail).
    x3 = conjugate_gradients(lambda V: M @ V, rhs, lambda V: V, 1e-12, 3)
    assert rel_err(x3, ref) > 1e-3


@pytest.mark.parametrize("learned_noise", [True, False])
@pytest.mark.parametrize("tol", [1e-8, 1e-2])
def test_large_grid_marginal_likelihood_equals_dense_within_its_gap(learned_noise, tol):
    """Sparse-statistics MLL (Nystrom log-det + CG) against the dense closed form."""
    interp, kernel, X, y, noise = setup(d=3, g=7, n=150)
    if learned_noise:
        noise = torch.full_like(noise, 0.04)
    W = interp.weights(X)
    root = grid_kernel_root(kernel, interp.grid)
    factors = [f.detach().clone().requires_grad_() for f in root.factors]
    L_K = GridKernelRoot(tuple(factors))
    n, c = torch.tensor(float(len(y)), dtype=DTYPE), (y.square() / noise).sum()
    if learned_noise:  # raw sums with a differentiable precision, as GridStatistics keeps them
        precision = torch.tensor(1 / 0.04, dtype=DTYPE, requires_grad=True)
        A_sparse = W.weighted_gram(torch.ones_like(noise), sparse=True)
        b, c, log_noise = W.t_matvec(y), y.square().sum(), n * math.log(0.04)
        inputs = [*factors, precision]
    else:
        precision = None
        _, A_sparse, b = statistics(interp, X, y, noise)
        log_noise = noise.log().sum()
        inputs = factors
    value = structured_log_marginal_likelihood(
        L_K, A_sparse, b, c, n, log_noise, precision, tol=tol
    )
    expected = log_marginal_likelihood(
        L_K, A_sparse.to_dense(), b, c, n, log_noise, precision=precision
    )
    grads = torch.autograd.grad(value, inputs)
    expected_grads = torch.autograd.grad(expected, inputs)
    # The value under-estimates log|C| by at most the trace gap: error in [0, tol / 2],
    # up to rounding (two LAPACK factorisations of the same matrix) at either end.
    rounding = 1e-9 * abs(float(expected))
    assert -rounding <= float(value - expected) <= tol / 2 + rounding
    for got, want in zip(grads, expected_grads, strict=True):
        scale = want.abs().max()
        assert (got - want).abs().max() <= 1e-7 * scale + 2 * tol * scale


def test_nystrom_inverse_is_a_certified_inverse_of_i_plus_g():
    """``I - B B^T = (I + G_N)^{-1}`` for a ``G_N`` with ``0 <= G_N <= G`` and
    ``tr(G - G_N)`` the stated residual; ``log|I + G_N|`` is its log-determinant."""
    interp, kernel, X, y, noise = setup(d=2, g=12, n=60)
    _, A, _ = statistics(interp, X, y, noise)
    L_K = grid_kernel_root(kernel, interp.grid)
    operator = WhitenedStatistic(L_K, A)
    eye = torch.eye(operator.size, dtype=DTYPE)
    G = operator.matmul(eye)
    G = 0.5 * (G + G.T)
    for tol in (1e-3, 1e-9):
        nystrom = operator.nystrom(tol)
        B = nystrom.complement_root
        inverse = eye - B @ B.T
        # The preconditioner is that inverse, floored: positive definite.
        assert torch.linalg.eigvalsh(nystrom.precondition(eye)).min() > 0
        assert torch.allclose(nystrom.precondition(eye), inverse, atol=1e-12)
        G_N = torch.linalg.inv(inverse) - eye
        G_N = 0.5 * (G_N + G_N.T)
        scale = float(torch.linalg.matrix_norm(G, ord=2))
        assert torch.linalg.eigvalsh(G_N).min() >= -1e-8 * scale
        assert torch.linalg.eigvalsh(G - G_N).min() >= -1e-8 * scale
        assert abs(float((G - G_N).trace() - nystrom.residual_trace)) <= 1e-8 * scale
        assert float(nystrom.residual_trace) <= max(tol, 1e3 * torch.finfo(DTYPE).eps * G.trace())
        assert torch.allclose(nystrom.logdet(), torch.logdet(eye + G_N), rtol=1e-10)


def test_conjugate_gradients_stops_where_round_off_stalls_it():
    """A tolerance float32 cannot reach: CG stops once the residual stagnates (not after
    ``max_iter``) and returns the iterate of smallest residual, as accurate as float32
    CG gets (checked against the float64 solve)."""
    torch.manual_seed(0)
    M = spd(200, cond=1e4)
    rhs = torch.randn(200, 2, dtype=DTYPE)
    products = []

    def matmul(V):
        products.append(1)
        return M.float() @ V

    x = conjugate_gradients(matmul, rhs.float(), lambda V: V, 1e-12, 100_000)
    assert len(products) < 2_000
    reference = torch.linalg.solve(M, rhs)
    assert rel_err(x.double(), reference) < 1e-3
    residual = torch.linalg.vector_norm(rhs - M @ x.double(), dim=0)
    assert (residual < 1e-3 * torch.linalg.vector_norm(rhs, dim=0)).all()


def test_float32_statistics_get_the_float64_posterior_and_likelihood():
    """Large-grid algebra runs in float64 whatever the inputs' dtype: float32 statistics
    of many precise observations (``n / noise = 10^7``, far beyond float32's resolution of
    the certified traces) give float64's posterior and likelihood to float32 accuracy,
    returned in float32."""
    torch.manual_seed(0)
    interp, kernel, X, y, _ = setup(d=2, g=40, n=5_000)
    noise = torch.full_like(y, 5e-4)
    with torch.no_grad():
        L_K = grid_kernel_root(kernel, interp.grid)
        _, A, b = statistics(interp, X, y, noise)
        probes = interp.weights(torch.rand(200, 2, dtype=DTYPE)).to_dense().T
        results = {}
        for dtype in (torch.float64, torch.float32):
            root = GridKernelRoot(tuple(f.to(dtype) for f in L_K.factors))
            post = structured_grid_posterior(root, A.to(dtype), b.to(dtype), tol=1e-8).posterior
            n = torch.tensor(5_000.0, dtype=dtype)
            c, logs = (y.square() / noise).sum().to(dtype), noise.log().sum().to(dtype)
            value = structured_log_marginal_likelihood(root, A.to(dtype), b.to(dtype), c, n, logs)
            assert post.root.dtype == post.mean.dtype == value.dtype == dtype
            variances = (post.root.double().T @ probes).square().sum(0)
            results[dtype] = (variances, probes.T @ post.mean.double(), value.double())
    (var64, mean64, value64), (var32, mean32, value32) = results.values()
    assert rel_err(var32, var64) < 1e-3
    assert rel_err(mean32, mean64) < 1e-4
    assert abs(float(value32 - value64)) < 1e-4 * abs(float(value64))


def test_float32_statistics_are_not_resolved_below_their_rounding():
    """Statistics accumulated in float32 carry ~eps_32 in every entry: the Nystrom pass
    stops at 0.1 eps_32 of tr(G) instead of resolving that rounding (which doubled the
    rank here), for a log-determinant within 1e-5 (relative) of the finer one."""
    torch.manual_seed(0)
    interp, kernel, X, _, _ = setup(d=3, g=17, n=5_000)
    with torch.no_grad():
        float32 = CubicGridInterpolation(interp.bounds.float(), 17)
        A = float32.weights(X.float()).weighted_gram(torch.full((5_000,), 100.0), sparse=True)
        L_K = grid_kernel_root(kernel.float(), float32.grid)
        L_K = GridKernelRoot(tuple(f.double() for f in L_K.factors))
        coarse = WhitenedStatistic(L_K, A.double(), input_dtype=torch.float32).nystrom(1e-8)
        fine = WhitenedStatistic(L_K, A.double()).nystrom(1e-8)
    assert coarse.complement_root.shape[-1] <= 0.5 * fine.complement_root.shape[-1]
    assert abs(float(coarse.logdet() - fine.logdet())) <= 1e-5 * float(fine.logdet())


@pytest.mark.parametrize("sizes", [(6, 6, 6), (5, 7, 9)])
def test_the_toeplitz_trace_equals_the_entrywise_one_and_is_cached(sizes):
    """tr(A K) from A's offset sums (an evenly spaced grid: Toeplitz factors) equals the
    sum over A's non-zeros of K's entries, for interpolation statistics and for a sparse A
    with entries far off the band; the sums are computed once per A."""
    from dataclasses import replace

    import streamgp.linalg.structured as structured

    torch.manual_seed(5)
    bounds = torch.stack([torch.zeros(3), torch.ones(3)]).to(DTYPE)
    interp = CubicGridInterpolation(bounds, list(sizes))
    kernel = ScaleKernel(RBFKernel(ard_num_dims=3)).to(DTYPE)
    kernel.base_kernel.lengthscale = torch.tensor([0.3, 0.5, 0.4], dtype=DTYPE)
    with torch.no_grad():
        root = grid_kernel_root(kernel, interp.grid, evenly_spaced=True)
    assert root.toeplitz and not grid_kernel_root(kernel, interp.grid).toeplitz
    K = root.to_dense() @ root.to_dense().T
    m = K.shape[-1]
    X = torch.rand(30, 3, dtype=DTYPE)
    _, interpolated, _ = statistics(interp, X, X.sum(-1), torch.full((30,), 0.1, dtype=DTYPE))
    far = torch.randint(0, m, (2, 50))
    scattered = torch.sparse_coo_tensor(far, torch.randn(50, dtype=DTYPE), (m, m)).coalesce()
    for A in (interpolated, scattered):
        dense = A.to_dense()
        exact = (dense * K).sum()
        fast = structured._kernel_weighted_sum(root, A)
        assert rel_err(fast, exact) < 1e-13
        general = structured._kernel_weighted_sum(replace(root, toeplitz=False), A)
        assert rel_err(general, exact) < 1e-13
        assert A in structured._OFFSET_SUMS  # kept for the next call, while A lives
        sums = structured._OFFSET_SUMS[A][1]
        assert structured._offset_sums(A, sizes) is sums
        assert WhitenedStatistic(root, A).trace == pytest.approx(float(exact), rel=1e-13)


def test_a_float32_root_is_not_taken_for_toeplitz():
    """float32 factors are Toeplitz only to ~1e-8, above the float32 statistics' trace gap:
    the offset sums would misstate tr(G) and run the Lanczos to full rank. Such roots (and
    statistics of another dtype) keep the entrywise trace."""
    import streamgp.linalg.structured as structured

    interp, kernel, X, y, noise = setup(d=3, g=6)
    with torch.no_grad():
        single = grid_kernel_root(
            kernel.float(), [g.float() for g in interp.grid], evenly_spaced=True
        )
        double = grid_kernel_root(kernel.double(), interp.grid, evenly_spaced=True)
    assert double.toeplitz and not single.toeplitz
    assert not structured._working_precision(single)[0].toeplitz  # cast, still not
    _, A, _ = statistics(interp, X, y, noise)
    mixed = structured._kernel_weighted_sum(double, A.float())  # falls back, no dtype error
    assert rel_err(mixed.double(), structured._kernel_weighted_sum(double, A)) < 1e-6
