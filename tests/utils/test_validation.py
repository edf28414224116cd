"""The shared input checks of the public boundary."""

import pytest

from streamgp.utils.validation import check_count


@pytest.mark.parametrize(
    "value, minimum, allow_none, message",
    [
        (-1, 0, False, "k must be a non-negative int, got -1."),
        (0, 1, False, "k must be a positive int, got 0."),
        (1, 2, False, "k must be an int >= 2, got 1."),
        (True, 0, False, "k must be a non-negative int, got True."),
        (2.0, 1, False, "k must be a positive int, got 2.0."),
        (None, 1, False, "k must be a positive int, got None."),
        (0, 1, True, "k must be a positive int or None, got 0."),
    ],
)
def test_check_count_names_the_argument_and_the_rule(value, minimum, allow_none, message):
    with pytest.raises(ValueError) as error:
        check_count(value, "k", minimum=minimum, allow_none=allow_none)
    assert str(error.value) == message


def test_check_count_returns_valid_values():
    assert check_count(0, "k") == 0
    assert check_count(5, "k", minimum=2) == 5
    assert check_count(None, "k", minimum=1, allow_none=True) is None
