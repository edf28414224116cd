"""The shared input checks of the public boundary."""

import pytest
import torch

from streamgp.utils.validation import check_count, check_targets


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


def test_model_argument_checks_name_the_argument():
    import torch
    from gpytorch.kernels import RBFKernel
    from gpytorch.likelihoods import FixedNoiseGaussianLikelihood, GaussianLikelihood

    from streamgp.utils.validation import (
        check_gaussian_likelihood,
        check_kernel,
        check_train_data,
    )

    X = torch.rand(4, 2, dtype=torch.float64)
    check_train_data(X, torch.rand(4, 1, dtype=torch.float64))
    check_train_data(X, torch.rand(4, 3, dtype=torch.float64), multi_output=True)
    with pytest.raises(ValueError, match="train_Y must have shape n x 1"):
        check_train_data(X, torch.rand(4, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match="train_X must have shape n x d with n >= 1"):
        check_train_data(X[:0], torch.rand(0, 1, dtype=torch.float64), allow_empty=False)
    with pytest.raises(TypeError, match="train_Y has dtype"):
        check_train_data(X, torch.rand(4, 1))

    check_gaussian_likelihood(None)
    check_gaussian_likelihood(GaussianLikelihood())
    with pytest.raises(TypeError, match="likelihood must be .* Pass train_Yvar"):
        check_gaussian_likelihood(
            FixedNoiseGaussianLikelihood(noise=torch.ones(4)), hint="Pass train_Yvar."
        )
    check_kernel(None)
    check_kernel(RBFKernel())
    with pytest.raises(TypeError, match="covar_module must be a gpytorch Kernel, got str"):
        check_kernel("rbf")


def test_several_target_columns_for_a_single_output_model_name_model_list_gp():
    with pytest.raises(ValueError, match=r"got \(5, 2\)\. For several outputs .* ModelListGP"):
        check_targets(torch.zeros(5, 2), "train_Y", 5)
    with pytest.raises(ValueError, match=r"got \(5,\)\.$"):
        check_targets(torch.zeros(5), "train_Y", 5)
