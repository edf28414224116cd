import math

import pytest
import torch

from streamgp.datasets import synthetic_classification, synthetic_function, synthetic_regression


def test_synthetic_regression_is_seeded_and_matches_its_function():
    a, b = synthetic_regression(64, d=3, seed=5), synthetic_regression(64, d=3, seed=5)
    assert torch.equal(a.X, b.X) and torch.equal(a.Y, b.Y)
    assert not torch.equal(a.X, synthetic_regression(64, d=3, seed=6).X)
    assert a.X.shape == (64, 3) and a.Y.shape == (64, 1) and a.task == "regression"
    assert 0 <= a.X.min() and a.X.max() <= 10
    noiseless = synthetic_regression(64, d=3, noise_std=0.0, seed=5)
    assert torch.equal(noiseless.Y, synthetic_function(noiseless.X))
    x = noiseless.X[0]
    expected = sum(math.sin(0.6 * v) for v in x.tolist()) + 0.5 * math.cos(0.3 * x[0] * x[-1])
    assert noiseless.Y[0, 0].item() == pytest.approx(expected, abs=1e-12)
    residual = (a.Y - synthetic_function(a.X)).std().item()
    assert 0.07 < residual < 0.13  # noise_std = 0.1
    single = synthetic_regression(8, dtype=torch.float32)
    assert single.X.dtype == single.Y.dtype == torch.float32


def test_synthetic_classification_labels():
    data = synthetic_classification(500, num_classes=3, seed=1)
    assert data.X.shape == (500, 2) and data.Y.shape == (500,) and data.Y.dtype == torch.long
    assert data.task == "classification" and data.num_classes == 3
    assert sorted(data.Y.unique().tolist()) == [0, 1, 2]
    assert torch.equal(data.Y, synthetic_classification(500, num_classes=3, seed=1).Y)
    # Smooth boundaries: nearby points usually share a label.
    near = torch.cdist(data.X, data.X) < 0.3
    same = data.Y[:, None] == data.Y[None, :]
    assert same[near].float().mean() > 0.9


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: synthetic_regression(0), "n must be a positive int"),
        (lambda: synthetic_regression(5, d=0), "d must be a positive int"),
        (lambda: synthetic_regression(5, noise_std=-1.0), "noise_std must be"),
        (lambda: synthetic_classification(5, num_classes=1), "num_classes must be"),
        (lambda: synthetic_classification(2.5), "n must be a positive int"),
    ],
)
def test_bad_arguments(call, message):
    with pytest.raises(ValueError, match=message):
        call()
