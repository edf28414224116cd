import pytest
import torch

from streamgp.settings import exact_prior_variance


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def ski_prior_variance():
    """Predict with SKI's own interpolated prior variance ``w^T K_UU w``.

    The models add ``k(x, x) - w^T K_UU w`` to predictive variances by default
    (:mod:`streamgp.linalg.prior_variance`); tests against the dense *exact SKI*
    oracles switch that off with this fixture (``tests/models/test_exact_prior_variance.py``
    tests the default against the corrected oracle).
    """
    with exact_prior_variance(False):
        yield
