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
