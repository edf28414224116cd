"""LearnedProjection: the paper's linear -> batch-norm -> tanh feature map."""

import pytest
import torch

from streamgp.models import LearnedProjection


def _inputs(n=40, d=6):
    return 2 * torch.rand(n, d, dtype=torch.float64) - 1


def test_features_match_the_closed_form_in_both_modes():
    projection = LearnedProjection(6).double()
    X = _inputs()
    linear = X @ projection.linear.weight.T + projection.linear.bias
    bn = projection.batch_norm
    # Training mode: batch statistics (biased variance, as BatchNorm normalises).
    batch = (linear - linear.mean(0)) / (linear.var(0, unbiased=False) + bn.eps).sqrt()
    expected = torch.tanh(batch * bn.weight + bn.bias)
    torch.testing.assert_close(projection(X), expected)
    assert projection(X).abs().max() < 1
    # Eval mode after calibrate: the running statistics are those of X.
    projection.calibrate(X).eval()
    torch.testing.assert_close(bn.running_mean, linear.mean(0))
    torch.testing.assert_close(bn.running_var, linear.var(0))
    running = (linear - linear.mean(0)) / (linear.var(0) + bn.eps).sqrt()
    torch.testing.assert_close(projection(X[:1]), torch.tanh(running * bn.weight + bn.bias)[:1])


def test_calibrate_changes_no_parameter_and_keeps_the_mode():
    projection = LearnedProjection(6).double()
    before = [p.detach().clone() for p in projection.parameters()]
    projection.calibrate(_inputs())
    assert projection.training
    for old, new in zip(before, projection.parameters(), strict=True):
        assert torch.equal(old, new)


def test_gradients_reach_every_parameter():
    projection = LearnedProjection(6, 3).double()
    projection(_inputs()).pow(2).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in projection.parameters())


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: LearnedProjection(0), "input_dim must be a positive int"),
        (lambda: LearnedProjection(3, output_dim=True), "output_dim must be a positive int"),
        (lambda: LearnedProjection(3).double()(_inputs(5, 4)), "X"),
        (lambda: LearnedProjection(6).double()(_inputs(1, 6)), "at least 2 rows"),
        (lambda: LearnedProjection(6).double().calibrate(_inputs(1, 6)), "n >= 2"),
    ],
)
def test_bad_arguments_raise_clear_errors(make, message):
    with pytest.raises(ValueError, match=message):
        make()
