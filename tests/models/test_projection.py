"""LearnedProjection (the paper's linear -> batch-norm -> tanh map) and ProjectedKernel."""

import pytest
import torch
from gpytorch.kernels import RBFKernel, ScaleKernel

from streamgp.models import LearnedProjection, ProjectedKernel


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


# ---------------------------------------------------------------- ProjectedKernel
def _projected_kernel(batch_shape=None):
    batch_shape = torch.Size() if batch_shape is None else batch_shape
    base = ScaleKernel(RBFKernel(ard_num_dims=2, batch_shape=batch_shape), batch_shape=batch_shape)
    return ProjectedKernel(base, LearnedProjection(6).double()).double()


def test_projected_kernel_is_the_base_kernel_on_the_features_in_both_modes():
    kernel = _projected_kernel()
    X, Z = _inputs(), _inputs(7)
    # Training mode: batch statistics of each argument, as LearnedProjection computes.
    expected = kernel.base_kernel(kernel.projection(X)).to_dense()
    torch.testing.assert_close(kernel(X).to_dense(), expected)
    kernel.projection.calibrate(X)
    kernel.eval()
    features_X, features_Z = kernel.projection(X), kernel.projection(Z)
    torch.testing.assert_close(
        kernel(Z, X).to_dense(), kernel.base_kernel(features_Z, features_X).to_dense()
    )
    torch.testing.assert_close(
        kernel(Z, diag=True), kernel.base_kernel(features_Z, diag=True), atol=1e-12, rtol=0
    )


def test_projected_kernel_flattens_batched_inputs():
    kernel = _projected_kernel(torch.Size([3]))
    kernel.projection.calibrate(_inputs())
    kernel.eval()
    X = _inputs(10).expand(3, 10, 6)
    expected = kernel.base_kernel(kernel.projection(X[0]).expand(3, 10, 2)).to_dense()
    torch.testing.assert_close(kernel(X).to_dense(), expected)
    assert kernel.batch_shape == torch.Size([3])


def test_frozen_normalization_keeps_running_statistics_in_training_mode():
    kernel = _projected_kernel()
    X = _inputs()
    kernel.projection.calibrate(X)
    running = kernel.projection.batch_norm.running_mean.clone()
    kernel.freeze_normalization = True
    kernel.train()
    assert kernel.training and not kernel.projection.training
    kernel(X[:1], X[:1]).to_dense().sum().backward()  # one row: running statistics only
    assert torch.equal(kernel.projection.batch_norm.running_mean, running)
    assert all(p.grad is not None for p in kernel.projection.linear.parameters())


def test_projected_kernel_needs_a_learned_projection():
    with pytest.raises(TypeError, match="projection must be a LearnedProjection"):
        ProjectedKernel(RBFKernel(), torch.nn.Linear(3, 2))
