r"""Cholesky factorisation with the error check that :mod:`streamgp.settings` can skip.

``torch.linalg.cholesky`` reads the factorisation's ``info`` on the host to raise on a
matrix that is not positive definite; on a GPU that read synchronises the device. Every
factorisation of streamgp's linear algebra goes through :func:`cholesky`, which keeps
the check by default and leaves it out inside
:class:`~streamgp.settings.skip_value_checks` (a failed factorisation then yields NaNs).
"""

from __future__ import annotations

import torch
from torch import Tensor

from streamgp.settings import skip_value_checks


def cholesky(A: Tensor) -> Tensor:
    r"""Lower Cholesky factor of the symmetric positive-definite ``A`` (batched).

    Raises:
        torch.linalg.LinAlgError: If ``A`` is not positive definite (unless value
            checks are skipped).

    Example:
        >>> A = torch.tensor([[4.0, 2.0], [2.0, 3.0]])
        >>> cholesky(A) @ cholesky(A).mT
        tensor([[4., 2.],
                [2., 3.]])
    """
    if skip_value_checks.on():
        return torch.linalg.cholesky_ex(A)[0]
    return torch.linalg.cholesky(A)
