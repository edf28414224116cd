"""The value checks of :mod:`streamgp.settings`: "ok" flags (``value_check_all``) read
together with failure flags, negated on the host."""

import pytest
import torch

from streamgp.settings import (
    deferred_value_checks,
    skip_value_checks,
    value_check,
    value_check_all,
)


def test_value_check_all_raises_unless_all_true_now_or_at_the_read():
    value_check_all(torch.tensor([True, True]), lambda: ValueError("never"))
    with pytest.raises(ValueError, match="now"):
        value_check_all(torch.tensor([True, False]), lambda: ValueError("now"))
    with pytest.raises(ValueError, match="at the read"):
        with deferred_value_checks() as checks:
            value_check_all(torch.tensor(False), lambda: ValueError("at the read"))
            assert not checks.read_done  # nothing read before the scope's read
    with skip_value_checks():
        value_check_all(torch.tensor(False), lambda: ValueError("skipped"))


def test_ok_and_failure_flags_are_read_together_in_registration_order():
    seen = []
    with deferred_value_checks() as checks:
        value_check_all(torch.tensor([True, True]), lambda: ValueError("ok flag"))
        value_check(torch.tensor([False, False]), lambda: ValueError("failure flag"))
        checks.decide(torch.tensor(True), seen.append)
        checks.decide(torch.tensor(False), seen.append)
        checks.read()
    assert seen == [True, False]
    with pytest.raises(ValueError, match="first"):
        with deferred_value_checks():
            value_check_all(torch.tensor(False), lambda: ValueError("first"))
            value_check(torch.tensor(True), lambda: ValueError("second"))
    # After the read, a check is made where it is registered.
    with deferred_value_checks() as checks:
        checks.read()
        with pytest.raises(ValueError, match="late"):
            value_check_all(torch.tensor([True, False]), lambda: ValueError("late"))


def test_recorded_factorisation_failures_make_one_flag():
    with deferred_value_checks() as checks:
        assert checks.failure_flag() is None
        only = torch.tensor(False)
        checks.record_failure(only)
        assert checks.failure_flag() is only  # one flag: no stacking
        checks.record_failure(torch.tensor([False, True]))
        assert bool(checks.failure_flag())
        checks.failures.clear()


def test_every_tuning_constant_is_the_default_where_it_is_used():
    """Each knob is defined once, in streamgp.settings; the class attributes and module
    constants that use it default to it (and can be overridden there)."""
    from streamgp import settings
    from streamgp.interpolation import grid
    from streamgp.linalg import factor, love, posterior_covariance, statistics
    from streamgp.models import KissGP, WiskiGP, additive_wiski, softki
    from streamgp.models.online_softki import SoftmaxPointInterpolation
    from streamgp.models.utils import grids, resolution

    uses = {
        "DEFAULT_GRID_POINTS": [grids],
        "DEFAULT_CUDA_GRID_POINTS": [grids],
        "HIGH_DIM_POINTS_PER_UNIT": [grids],
        "DEFAULT_GROUP_GRID_SIZE": [additive_wiski],
        "ADDITIVE_GRID_POINTS": [additive_wiski],
        "MAX_DENSE_GRID": [WiskiGP, KissGP],
        "LIKELIHOOD_TOLERANCE": [WiskiGP],
        "STATISTICS_CHUNK": [WiskiGP, KissGP],
        "GRID_MARGIN": [grid],
        "GRID_GROWTH": [grid],
        "MIN_SPACINGS_PER_LENGTHSCALE": [resolution],
        "FOLD_RANK": [WiskiGP],
        "ROOT_UPDATE_MAX_FRACTION": [WiskiGP],
        "PREDICTIONS_PER_REFIT": [WiskiGP],
        "PENDING_FRACTION": [statistics],
        "MAX_CACHE_ENTRIES": [posterior_covariance],
        "GATHER_COST_RATIO": [posterior_covariance],
        "LAPACK_MIN_SIZE": [factor],
        "QR_CHUNK": [softki],
        "SMALL_NOISE_RATIO": [softki],
        "SOFTKI_FIT_MAXITER": [softki],
        "NOISE_CHECK_ROWS": [softki],
        "FAR_MARGIN": [SoftmaxPointInterpolation],
    }
    assert set(uses) | {"LOVE_TOLERANCE", "LANCZOS_BLOCK_SIZE"} == {
        name for name in settings.__all__ if name.isupper()
    }
    for name, places in uses.items():
        for place in places:
            assert getattr(place, name) is getattr(settings, name), (place, name)
    assert love.DEFAULT_TOLERANCE is settings.LOVE_TOLERANCE
    assert WiskiGP.love_tolerance is KissGP.love_tolerance is settings.LOVE_TOLERANCE
    assert love.DEFAULT_BLOCK_SIZE is settings.LANCZOS_BLOCK_SIZE
