r"""Cholesky factorisation, inverse and solve, with the check that :mod:`streamgp.settings` skips.

``torch.linalg.cholesky`` reads the factorisation's ``info`` on the host to raise on a
matrix that is not positive definite; on a GPU that read synchronises the device. Every
factorisation of streamgp's linear algebra goes through :func:`cholesky`, which keeps
the check by default and leaves it out inside
:class:`~streamgp.settings.skip_value_checks` (a failed factorisation then yields NaNs).

On the CPU, large constant matrices are factorised and inverted by LAPACK's ``potrf`` /
``potri`` through SciPy, which torch does not expose: the grid-space marginal likelihood
is one ``m x m`` Cholesky factor and its inverse per evaluation, and at ``m = 1000`` on
one thread ``potri`` takes 18 ms against 25 ms for ``torch.cholesky_inverse`` (which
solves against the identity). Both may write over their input, so an evaluation needs
no fresh ``m x m`` block for them: fresh blocks are fresh pages from the OS, whose
faults cost about as much as the arithmetic at this size. SciPy's BLAS has its own
thread pool (by default one thread per core), so each LAPACK call here runs with
torch's intra-op thread count instead (``torch.set_num_threads``, through
``threadpoolctl``, restored after the call): on the shared 2-core VM with other jobs
running, a 600 x 600 ``potrf`` on SciPy's two default threads took 8-110 ms against
3-4 ms on one, which made ``WiskiGP``'s data-space marginal likelihood at
``d = 10``, ``n = 600`` 183-242 against 87-144 ms. Tensors on other devices, in other
dtypes, batched, small, or that autograd must differentiate take torch's path.
"""

from __future__ import annotations

import functools

import torch
from scipy.linalg import lapack
from threadpoolctl import ThreadpoolController
from torch import Tensor

from streamgp import settings
from streamgp.settings import active_value_checks, skip_value_checks

#: See :data:`streamgp.settings.LAPACK_MIN_SIZE` (overridable here).
LAPACK_MIN_SIZE = settings.LAPACK_MIN_SIZE


def _lapack_eligible(A: Tensor) -> bool:
    return (
        A.device.type == "cpu"
        and A.dim() == 2
        and A.shape[-1] >= LAPACK_MIN_SIZE
        and A.dtype in (torch.float32, torch.float64)
        and not (A.requires_grad and torch.is_grad_enabled())
    )


@functools.cache
def _blas_pools() -> ThreadpoolController:
    # The BLAS libraries loaded with SciPy's LAPACK (imported above), found once.
    return ThreadpoolController().select(user_api="blas")


def _torch_threads():
    """SciPy's BLAS limited to torch's intra-op thread count for one call (restored after)."""
    return _blas_pools().limit(limits=torch.get_num_threads())


def _fortran_view(A: Tensor):
    # A row-major matrix read in Fortran order is its transpose: for the symmetric A
    # and the lower factor L that is A itself and the upper factor U = L^T, so LAPACK's
    # upper-triangle routines work on torch's memory without a copy.
    return A.detach().resolve_conj().resolve_neg().numpy().T


def cholesky(A: Tensor, overwrite_input: bool = False) -> Tensor:
    r"""Lower Cholesky factor of the symmetric positive-definite ``A`` (batched).

    Args:
        A: The matrix (or a batch of them).
        overwrite_input: Allow the factor to be written over ``A``'s memory (a
            temporary the caller drops): no fresh ``m x m`` block, where LAPACK is used.

    Raises:
        torch.linalg.LinAlgError: If ``A`` is not positive definite (unless value
            checks are skipped).

    Example:
        >>> A = torch.tensor([[4.0, 2.0], [2.0, 3.0]])
        >>> cholesky(A) @ cholesky(A).mT
        tensor([[4., 2.],
                [2., 3.]])
    """
    if _lapack_eligible(A):
        matrix = _fortran_view(A)
        (potrf,) = lapack.get_lapack_funcs(("potrf",), (matrix,))
        with _torch_threads():
            upper, info = potrf(matrix, lower=0, clean=1, overwrite_a=int(overwrite_input))
        L = torch.from_numpy(upper.T)
        if info > 0:
            if not skip_value_checks.on():
                raise torch.linalg.LinAlgError(
                    f"linalg.cholesky: The factorization could not be completed because the "
                    f"input is not positive-definite (the leading minor of order {info} is "
                    f"not positive-definite)."
                )
            L.fill_(float("nan"))
        return L
    if skip_value_checks.on():
        return torch.linalg.cholesky_ex(A)[0]
    checks = active_value_checks()
    if checks is not None and checks.defer_factorisations:  # read with the next call
        L, info = torch.linalg.cholesky_ex(A)
        checks.record_failure(info > 0)
        return L
    return torch.linalg.cholesky(A)


def cholesky_inverse_lower(L: Tensor, overwrite_input: bool = False) -> Tensor:
    r"""The lower triangle (zeros above) of ``(L L^T)^{-1}`` from its lower Cholesky factor.

    For callers that only sum over the symmetric inverse (traces, partial traces): it
    saves the pass that mirrors the triangle. ``L`` must be zero above its diagonal, as
    :func:`cholesky` returns it; with ``overwrite_input`` the inverse may be written
    over it (where LAPACK is used).
    """
    if _lapack_eligible(L):
        factor = _fortran_view(L)
        (potri,) = lapack.get_lapack_funcs(("potri",), (factor,))
        with _torch_threads():
            upper, _ = potri(factor, lower=0, overwrite_c=int(overwrite_input))
        return torch.from_numpy(upper.T)
    return torch.cholesky_inverse(L).tril_()


def cholesky_inverse(L: Tensor) -> Tensor:
    r"""``(L L^T)^{-1}`` from the lower Cholesky factor ``L``, as ``torch.cholesky_inverse``.

    Example:
        >>> A = torch.tensor([[4.0, 2.0], [2.0, 3.0]])
        >>> torch.allclose(cholesky_inverse(cholesky(A)) @ A, torch.eye(2), atol=1e-6)
        True
    """
    if _lapack_eligible(L):
        lower = cholesky_inverse_lower(L)
        full = lower + lower.mT
        full.diagonal().sub_(lower.diagonal())
        return full
    return torch.cholesky_inverse(L)


def cholesky_solve(rhs: Tensor, L: Tensor) -> Tensor:
    r"""``(L L^T)^{-1} rhs`` for a lower Cholesky factor ``L``, as ``torch.cholesky_solve``.

    Two triangular solves: ``torch.cholesky_solve`` first copies ``L`` into column-major
    order, which at ``m = 1000`` costs several times the two solves for a few columns.
    """
    half = torch.linalg.solve_triangular(L, rhs, upper=False)
    return torch.linalg.solve_triangular(L.mT, half, upper=True)
