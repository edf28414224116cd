"""Cholesky factorisation, inverse and solve (LAPACK through SciPy on the CPU) against torch."""

import pytest
import torch

from streamgp.linalg.factor import (
    LAPACK_MIN_SIZE,
    cholesky,
    cholesky_inverse,
    cholesky_inverse_lower,
    cholesky_solve,
)
from streamgp.settings import skip_value_checks


def spd(m, dtype, seed=0):
    generator = torch.Generator().manual_seed(seed)
    X = torch.randn(m, m + 5, dtype=dtype, generator=generator)
    return X @ X.mT / m + torch.eye(m, dtype=dtype)


SIZES = [LAPACK_MIN_SIZE // 2, LAPACK_MIN_SIZE + 3]  # torch's path, then LAPACK's


@pytest.mark.parametrize("m", SIZES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_factor_inverse_and_solve_equal_torch(m, dtype):
    A = spd(m, dtype)
    tol = dict(rtol=1e-10, atol=1e-10) if dtype == torch.float64 else dict(rtol=1e-4, atol=1e-4)
    L = cholesky(A)
    assert L.dtype == dtype and L.shape == A.shape
    assert torch.allclose(L, torch.linalg.cholesky(A), **tol)
    assert torch.equal(L, L.tril())
    expected_inverse = torch.cholesky_inverse(torch.linalg.cholesky(A))
    assert torch.allclose(cholesky_inverse(L), expected_inverse, **tol)
    assert torch.allclose(cholesky_inverse_lower(L), expected_inverse.tril(), **tol)
    rhs = torch.randn(m, 3, dtype=dtype)
    assert torch.allclose(cholesky_solve(rhs, L), torch.linalg.solve(A, rhs), **tol)


def test_overwrite_input_reuses_memory_and_leaves_others_alone():
    m = LAPACK_MIN_SIZE + 3
    A = spd(m, torch.float64)
    original = A.clone()
    L = cholesky(A)
    assert torch.equal(A, original)  # the default copies
    scratch = A.clone()
    L_in_place = cholesky(scratch, overwrite_input=True)
    assert L_in_place.data_ptr() == scratch.data_ptr()
    assert torch.equal(L_in_place, L)
    inverse = cholesky_inverse_lower(L.clone(), overwrite_input=True)
    assert torch.allclose(inverse, torch.cholesky_inverse(L).tril(), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("m", SIZES)
def test_not_positive_definite_raises_or_gives_nan_when_checks_are_skipped(m):
    A = spd(m, torch.float64)
    A[m // 2, m // 2] = -1.0
    with pytest.raises(torch.linalg.LinAlgError, match="positive-definite"):
        cholesky(A)
    if m >= LAPACK_MIN_SIZE:  # torch's cholesky_ex returns a partial factor instead
        with skip_value_checks():
            assert torch.isnan(cholesky(A)).all()


def test_autograd_goes_through_torch():
    A = spd(LAPACK_MIN_SIZE + 3, torch.float64).requires_grad_()
    L = cholesky(A)
    assert L.requires_grad
    (grad,) = torch.autograd.grad(L.diagonal().log().sum(), A)
    assert torch.allclose(grad, 0.5 * torch.linalg.inv(A.detach()), rtol=1e-8, atol=1e-10)


def test_lapack_runs_on_torchs_thread_count_and_restores_blas(monkeypatch):
    """SciPy's BLAS would otherwise use a thread per core whatever torch.set_num_threads
    says (oversubscribed, a 600 x 600 potrf took up to 30x longer on a loaded VM)."""
    from streamgp.linalg import factor

    pools = factor._blas_pools()
    if not pools.lib_controllers:
        pytest.skip("no BLAS library that threadpoolctl can control")
    seen = []
    real = factor.lapack.get_lapack_funcs

    def spying(names, arrays):
        funcs = real(names, arrays)

        def wrap(func):
            def call(*args, **kwargs):
                seen.append([lib.get_num_threads() for lib in pools.lib_controllers])
                return func(*args, **kwargs)

            return call

        return tuple(wrap(func) for func in funcs)

    monkeypatch.setattr(factor.lapack, "get_lapack_funcs", spying)
    A = torch.randn(200, 200, dtype=torch.float64)
    A = A @ A.T + 200 * torch.eye(200, dtype=torch.float64)
    threads = torch.get_num_threads()
    with pools.limit(limits=2):  # BLAS on two threads, as on a 2-core machine by default
        before = [lib.get_num_threads() for lib in pools.lib_controllers]
        try:
            torch.set_num_threads(1)
            cholesky_inverse(cholesky(A))
        finally:
            torch.set_num_threads(threads)
        assert len(seen) == 2 and all(counts == [1] * len(before) for counts in seen)
        assert [lib.get_num_threads() for lib in pools.lib_controllers] == before
