"""Cubic grid interpolation: layout, accuracy and the sparse products."""

import pytest
import torch
from gpytorch.utils.interpolation import Interpolation

from streamgp.interpolation import CubicGridInterpolation

DTYPE = torch.float64


def make(d=2, g=9):  # g: points per dimension, an int or one per dimension
    bounds = torch.stack([torch.zeros(d), torch.ones(d)]).to(DTYPE)
    return CubicGridInterpolation(bounds, g)


def test_grid_in_model_dtype_and_padded():
    interp = make()
    assert all(g.dtype == DTYPE for g in interp.grid)
    spacing = 1.0 / (9 - 3)
    assert interp.grid[0][0].item() == pytest.approx(-spacing)
    assert interp.grid[0][-1].item() == pytest.approx(1 + spacing)
    assert interp.grid[0][1].item() == pytest.approx(0.0) and interp.grid[0][
        -2
    ].item() == pytest.approx(1.0)


def test_flat_index_first_dimension_slowest():
    interp = make(d=3, g=6)
    points = interp.grid_points()
    target = points[[91, 62]]  # interior grid points (indices 1..4 in each dim)
    W = interp.weights(target).to_dense()
    assert torch.allclose(W[0], torch.nn.functional.one_hot(torch.tensor(91), 216).to(DTYPE))
    assert torch.allclose(W[1], torch.nn.functional.one_hot(torch.tensor(62), 216).to(DTYPE))
    assert torch.equal(
        points[1], torch.stack([interp.grid[0][0], interp.grid[1][0], interp.grid[2][1]])
    )


def test_interpolation_accuracy_and_partition_of_unity():
    interp = make(d=2, g=40)
    X = torch.rand(100, 2, dtype=DTYPE)
    W = interp.weights(X).to_dense()
    assert torch.allclose(W.sum(-1), torch.ones(100, dtype=DTYPE))
    f = lambda Z: torch.sin(3 * Z[:, 0]) * torch.cos(2 * Z[:, 1])  # noqa: E731
    assert (W @ f(interp.grid_points()) - f(X)).abs().max() < 1e-4


@pytest.mark.parametrize("d, grid_size", [(1, 7), (2, (5, 8)), (3, 6)])
def test_weights_equal_gpytorch_interpolation(d, grid_size):
    """Our vectorised weights reproduce gpytorch's ``Interpolation.interpolate``."""
    interp = make(d=d, g=grid_size)
    corners = torch.cartesian_prod(*[torch.tensor([0.0, 1.0], dtype=DTYPE)] * d).reshape(-1, d)
    X = torch.cat([torch.rand(40, d, dtype=DTYPE), corners, interp.grid_points()[:5].clamp(0, 1)])
    ours = interp.weights(X).to_dense()
    indices, values = Interpolation().interpolate(interp.grid, X)
    theirs = torch.zeros_like(ours).scatter_add_(-1, indices, values)
    assert torch.allclose(ours, theirs, atol=1e-12)
    # Batched inputs give the weights of the flattened points.
    batched = interp.weights(X[:40].reshape(4, 10, d)).to_dense()
    assert torch.allclose(batched.reshape(40, -1), ours[:40], atol=1e-14)


def test_weights_differentiable_in_inputs():
    interp = make(d=2, g=12)
    X = torch.rand(6, 2, dtype=DTYPE, requires_grad=True)
    v = torch.randn(interp.num_grid, dtype=DTYPE)
    torch.autograd.gradcheck(lambda Z: interp.weights(Z).dot(v), (X,))


def test_sparse_products_match_dense():
    interp = make()
    X = torch.rand(3, 5, 2, dtype=DTYPE)
    W = interp.weights(X)
    dense = W.to_dense()
    R = torch.randn(interp.num_grid, 7, dtype=DTYPE)
    v = torch.randn(interp.num_grid, dtype=DTYPE)
    assert torch.allclose(W.matmul(R), dense @ R)
    assert torch.allclose(W.dot(v), dense @ v)
    W2 = interp.weights(X[0])
    w = torch.rand(5, dtype=DTYPE)
    assert torch.allclose(W2.t_matvec(w), W2.to_dense().T @ w)
    assert torch.allclose(W2.weighted_gram(w), W2.to_dense().T @ torch.diag(w) @ W2.to_dense())


@pytest.mark.parametrize("gather_limit", [2**24, 1], ids=["gathered", "sparse"])
def test_one_set_of_rows_against_a_batch_of_matrices_matches_dense(monkeypatch, gather_limit):
    # Each output's root of a model whose outputs are batch members: the rows are shared,
    # the gathered (index_select) and the side-by-side sparse products are each member's.
    monkeypatch.setattr(
        type(make().weights(torch.rand(1, 2, dtype=DTYPE))), "GATHER_LIMIT", gather_limit
    )
    interp = make()
    W = interp.weights(torch.rand(5, 2, dtype=DTYPE))
    R = torch.randn(3, interp.num_grid, 7, dtype=DTYPE, requires_grad=True)
    out = W.matmul(R)
    assert out.shape == (3, 5, 7)
    expected = W.to_dense() @ R
    assert torch.allclose(out, expected)
    (grad,) = torch.autograd.grad(out.square().sum(), R)
    (expected_grad,) = torch.autograd.grad(expected.square().sum(), R)
    assert torch.allclose(grad, expected_grad)
    lifted = interp.weights(torch.rand(1, 5, 2, dtype=DTYPE))  # a size-one batch of rows
    assert torch.allclose(lifted.matmul(R), lifted.to_dense() @ R)


def test_bounds_check_names_argument_and_tolerates_roundoff():
    interp = make()
    interp.check_inside(torch.tensor([[1.0 + 1e-9, 0.0]], dtype=DTYPE), "X")
    with pytest.raises(
        ValueError, match=r"Z has points outside grid_bounds in dimension\(s\) \[1\]"
    ):
        interp.check_inside(torch.tensor([[0.5, -0.1]], dtype=DTYPE), "Z")


def _kron_rows(axes):
    r"""Row-wise Kronecker product of per-axis dense weights (first axis slowest)."""
    rows = axes[0].to_dense()
    for axis in axes[1:]:
        rows = (rows.unsqueeze(-1) * axis.to_dense().unsqueeze(-2)).flatten(-2)
    return rows


@pytest.mark.parametrize("d", [1, 2, 3])
def test_per_axis_rows_are_the_kronecker_factors_of_the_weights(d):
    interp = make(d=d, g=7)
    X = torch.rand(2, 5, d, dtype=DTYPE)
    W = interp.weights(X)
    assert W.axis_rows is not None and len(W.axes) == d
    torch.testing.assert_close(_kron_rows(W.axes), W.to_dense(), rtol=0, atol=1e-15)
    # Stacking, cutting from the graph and adding a batch dimension keep them factors.
    other = interp.weights(torch.rand(3, d, dtype=DTYPE))
    for derived in (W.cat(other), W.detach(), W.unsqueeze_batch()):
        assert derived.axis_rows is not None
        torch.testing.assert_close(_kron_rows(derived.axes), derived.to_dense(), rtol=0, atol=1e-15)
    # With explicitly given axes on one side, the stacked rows are still the factors.
    given = type(other)(other.indices, other.values, other.num_grid, other.axes)
    stacked = W.cat(given)
    torch.testing.assert_close(_kron_rows(stacked.axes), stacked.to_dense(), rtol=0, atol=1e-15)


def test_tensor_product_by_gather_equals_the_product_axis_by_axis(monkeypatch):
    interp = make(d=3, g=8)
    X = torch.rand(4, 6, 3, dtype=DTYPE)
    gathered = interp.weights(X)
    monkeypatch.setattr(CubicGridInterpolation, "PRODUCT_GATHER_MAX", 0)
    by_axis = interp.weights(X)
    assert torch.equal(gathered.indices, by_axis.indices)
    assert torch.equal(gathered.values, by_axis.values)  # the same products, same order


def test_points_on_the_bounds_and_grid_nodes_keep_their_neighbours():
    interp = make(d=2, g=9)
    nodes = torch.tensor([[0.0, 1.0], [1.0, 0.0], [0.5, 1.0 / 6.0]], dtype=DTYPE)
    W = interp.weights(nodes)
    assert int(W.indices.min()) >= 0 and int(W.indices.max()) < interp.num_grid
    torch.testing.assert_close(W.values.sum(-1), torch.ones(3, dtype=DTYPE))
    # A node's weight sits on the node itself.
    dense = W.to_dense()
    torch.testing.assert_close(dense.max(-1).values, torch.ones(3, dtype=DTYPE))


def test_nan_and_inf_are_refused_as_such_by_the_box_check():
    interp = make()
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="Z contains NaN or Inf"):
            interp.check_inside(torch.tensor([[0.5, bad]], dtype=DTYPE), "Z")
