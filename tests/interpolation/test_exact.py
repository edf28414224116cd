"""The identity interpolation of a kernel evaluated exactly (``interpolation.exact``)."""

from __future__ import annotations

import pytest
import torch

from streamgp.interpolation.exact import ExactKernelInputs, InputRows
from streamgp.interpolation.grid import CubicGridInterpolation

DTYPE = torch.float64


def inputs() -> ExactKernelInputs:
    box = torch.tensor([[0.0] * 4, [1.0] * 4], dtype=DTYPE)
    return ExactKernelInputs(CubicGridInterpolation(box, 6))


def test_rows_are_the_inputs_and_batch_like_weights():
    interp = inputs()
    assert interp.num_grid == 6**4 and interp.grid_size == [6] * 4 and interp.dim == 4
    X = torch.rand(3, 4, dtype=DTYPE)
    rows = interp.weights(X)
    assert rows.inputs is X and rows.num_rows == 3 and rows.batch_shape == ()
    batched = rows.cat(InputRows(torch.rand(2, 1, 4, dtype=DTYPE), rows.num_grid))
    assert batched.inputs.shape == (2, 4, 4) and torch.equal(batched.inputs[1, :3], X)
    assert rows.unsqueeze_batch().inputs.shape == (1, 3, 4)
    assert rows.apply(lambda t: t.float()).inputs.dtype == torch.float32
    with pytest.raises(TypeError, match="no grid"):
        rows.matmul(torch.ones(interp.num_grid, 1, dtype=DTYPE))


def test_the_kernel_is_defined_everywhere_but_at_nan():
    interp = inputs()
    far = torch.full((2, 4), 7.0, dtype=DTYPE)
    interp.check_inside(far)
    assert not bool(interp.any_outside(far))
    assert interp.prediction_inputs(far, "error") is far
    far[0, 2] = float("nan")
    with pytest.raises(ValueError, match="train_X contains NaN"):
        interp.check_inside(far, "train_X")
    assert interp.to(dtype=torch.float32).bounds.dtype == torch.float32
