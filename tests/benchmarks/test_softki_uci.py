"""``benchmarks/softki_uci.py --data file.csv --target column``: Table 1 on a table of your own."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from gpytorch.means import ZeroMean

from streamgp.datasets import load_csv, make_standardized_split
from streamgp.models import SoftKIGP

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "softki_uci.py"


def _script():
    spec = importlib.util.spec_from_file_location("softki_uci", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_data_and_target_run_the_protocol_on_a_csv(tmp_path, monkeypatch):
    generator = torch.Generator().manual_seed(0)
    X = torch.rand(120, 3, generator=generator, dtype=torch.float64)
    y = torch.sin(3 * X).sum(-1) + 0.1 * torch.randn(120, generator=generator, dtype=X.dtype)
    frame = pd.DataFrame({"a": X[:, 0], "out": y, "b": X[:, 1], "c": X[:, 2]})
    frame.to_csv(tmp_path / "mine.csv", index=False)
    out = tmp_path / "out"
    argv = [
        "softki_uci.py", "--data", str(tmp_path / "mine.csv"), "--target", "out",
        "--models", "softki", "--seeds", "1", "--epochs", "2", "--softki-m", "8",
        "--batch-size", "32", "--out", str(out),
    ]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    _script().main()
    runs = pd.read_csv(out / "runs.csv")
    assert runs[["dataset", "model", "seed", "n_train", "n_test", "d"]].values.tolist() == [
        ["mine", "softki", 1, 108, 12, 3]
    ]
    # Oracle: the same protocol written out with the public helpers and the model.
    data = load_csv(tmp_path / "mine.csv", target="out")
    split = make_standardized_split(data.X, data.Y, seed=1)
    torch.manual_seed(1)
    model = SoftKIGP(
        split.train_X, split.train_Y, covar_module=_script().rbf_kernel(torch.float64),
        num_inducing=8, temperature=1.0, learn_temperature=False, noise=1e-3,
        learn_noise=False, seed=1, outcome_transform=None, mean_module=ZeroMean(),
    )  # fmt: skip
    model.fit(num_epochs=2, batch_size=32, lr=0.01, seed=1)
    mean = model.posterior(split.test_X).mean
    rmse = (mean - split.test_Y).square().mean().sqrt().item()
    assert runs["rmse"].item() == pytest.approx(rmse, rel=1e-10)
    table = (out / "softki_uci.md").read_text()
    assert "| mine | 108 | 3 | SoftKI-8 | 1 |" in table
    # The calibrated noise: the training residuals' mean square, and the NLL it gives.
    model.calibrate_noise()
    posterior = model.posterior(split.test_X, observation_noise=True)
    mean, variance = posterior.mean, posterior.variance
    nll = 0.5 * ((mean - split.test_Y).square() / variance + (2 * math.pi * variance).log())
    assert runs["nll_calibrated"].item() == pytest.approx(nll.mean().item(), rel=1e-8)
    assert runs["nll_calibrated"].item() < runs["nll"].item()
    assert f"mine: NLL {runs['nll'].item():.3g} -> {runs['nll_calibrated'].item():.3g}" in table


def test_data_needs_target(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "argv", ["softki_uci.py", "--data", str(tmp_path / "x.csv")])
    with pytest.raises(SystemExit, match="--target"):
        _script().main()
