import pytest
import torch

from streamgp.datasets import (
    StreamingSplit,
    TabularData,
    load_csv,
    load_streaming_split,
    make_standardized_split,
    make_streaming_split,
    synthetic_classification,
    synthetic_regression,
)


def _check_indices(split: StreamingSplit, n: int) -> None:
    both = torch.cat([split.train_index, split.test_index])
    assert both.sort().values.tolist() == list(range(n))  # disjoint and complete


def test_regression_split_sizes_scaling_and_standardization():
    data = synthetic_regression(1000, d=3, seed=4)
    split = make_streaming_split(data, seed=7)
    assert (split.name, split.task, split.seed) == (data.name, "regression", 7)
    assert split.train_X.shape == (900, 3) and split.test_X.shape == (100, 3)
    assert split.train_Y.shape == (900, 1) and split.test_Y.shape == (100, 1)
    assert split.num_pretrain == 45  # 5% of the training set
    assert split.pretrain_X.shape == (45, 3) and split.online_X.shape == (855, 3)
    assert torch.equal(torch.cat([split.pretrain_Y, split.online_Y]), split.train_Y)
    assert split.pretrain_X.data_ptr() == split.train_X.data_ptr()  # views, not copies
    _check_indices(split, 1000)

    # Inputs: every training column spans exactly [-1, 1]; test uses the training stats.
    assert split.train_X.min(dim=0).values.tolist() == [-1.0] * 3
    assert split.train_X.max(dim=0).values.tolist() == [1.0] * 3
    lo = data.X[split.train_index].min(dim=0).values
    hi = data.X[split.train_index].max(dim=0).values
    expected_test = 2 * (data.X[split.test_index] - lo) / (hi - lo) - 1
    torch.testing.assert_close(split.test_X, expected_test, rtol=0, atol=1e-14)
    torch.testing.assert_close(split.unscale_X(split.train_X), data.X[split.train_index])
    torch.testing.assert_close(split.scale_X(data.X[split.test_index]), split.test_X)

    # Targets: standardized with the training mean/std, reversible to original units.
    torch.testing.assert_close(split.train_Y.mean(), torch.tensor(0.0, dtype=torch.float64))
    torch.testing.assert_close(split.train_Y.std(), torch.tensor(1.0, dtype=torch.float64))
    torch.testing.assert_close(split.y_mean, data.Y[split.train_index].mean(0, keepdim=True))
    torch.testing.assert_close(split.unstandardize_Y(split.test_Y), data.Y[split.test_index])


def test_split_is_reproducible_by_seed():
    data = synthetic_regression(300, seed=0)
    a, b = make_streaming_split(data, seed=3), make_streaming_split(data, seed=3)
    for field in ("train_X", "train_Y", "test_X", "test_Y", "train_index", "test_index"):
        assert torch.equal(getattr(a, field), getattr(b, field))
    c = make_streaming_split(data, seed=4)
    assert not torch.equal(a.test_index, c.test_index)
    assert not torch.equal(a.train_index, c.train_index)
    # The global RNG neither influences nor is consumed by the split.
    torch.manual_seed(123)
    state = torch.get_rng_state()
    assert torch.equal(make_streaming_split(data, seed=3).train_index, a.train_index)
    assert torch.equal(torch.get_rng_state(), state)


def test_constant_columns_scale_to_zero():
    data = synthetic_regression(50, d=2, seed=1)
    X = data.X.clone()
    X[:, 1] = 3.5
    split = make_streaming_split(TabularData(data.name, data.task, X, data.Y), seed=0)
    assert torch.isfinite(split.train_X).all() and torch.isfinite(split.test_X).all()
    assert (split.train_X[:, 1] == 0).all() and (split.test_X[:, 1] == 0).all()
    assert (split.x_min[1], split.x_max[1]) == (2.5, 4.5)
    constant_y = TabularData(data.name, data.task, data.X, torch.ones_like(data.Y))
    flat = make_streaming_split(constant_y, seed=0)
    assert (flat.train_Y == 0).all() and flat.y_std.item() == 1.0


def test_classification_respects_the_source_split():
    data = synthetic_classification(200, num_classes=3, seed=2)
    is_test = torch.arange(200) % 5 == 0
    data = TabularData(data.name, data.task, data.X, data.Y, is_test)
    split = make_streaming_split(data, seed=1)
    assert split.task == "classification" and split.num_classes == 3
    assert split.test_index.tolist() == torch.nonzero(is_test).squeeze(-1).tolist()
    assert sorted(split.train_index.tolist()) == torch.nonzero(~is_test).squeeze(-1).tolist()
    assert split.train_Y.dtype == torch.long and split.train_Y.shape == (160,)
    assert torch.equal(split.train_Y, data.Y[split.train_index])
    assert split.num_pretrain == 8 and split.y_mean is None and split.y_std is None
    assert split.train_X.min() == -1.0 and split.train_X.max() == 1.0
    with pytest.raises(ValueError, match="labels are not scaled"):
        split.unstandardize_Y(split.test_Y)
    # Ignoring the source split draws a 10% test set like for regression.
    drawn = make_streaming_split(data, seed=1, use_source_split=False)
    assert drawn.test_index.numel() == 20
    _check_indices(drawn, 200)


def test_dtype_device_and_fractions():
    data = synthetic_regression(100, seed=0)
    split = make_streaming_split(
        data, seed=0, test_fraction=0.25, pretrain_fraction=0.2, dtype=torch.float32, device="cpu"
    )
    assert split.train_X.dtype == split.train_Y.dtype == split.y_std.dtype == torch.float32
    assert split.test_X.shape == (25, 2) and split.num_pretrain == 15
    tiny = make_streaming_split(synthetic_regression(12, seed=0), seed=0)
    assert tiny.num_pretrain == 1  # never empty


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"test_fraction": 0.0}, ValueError, "test_fraction must be a number in"),
        ({"test_fraction": 1.5}, ValueError, "test_fraction must be a number in"),
        ({"pretrain_fraction": 1}, ValueError, "pretrain_fraction must be a number in"),
        ({"dtype": torch.int32}, TypeError, "dtype must be a floating"),
        ({"seed": 1.5}, TypeError, "seed must be an int"),
    ],
)
def test_bad_arguments(kwargs, error, message):
    data = synthetic_regression(20, seed=0)
    kwargs = {"seed": 0, **kwargs}
    with pytest.raises(error, match=message):
        make_streaming_split(data, **kwargs)


def test_too_small_and_wrong_type():
    with pytest.raises(ValueError, match="too few for a split"):
        make_streaming_split(synthetic_regression(2, seed=0), seed=0)
    with pytest.raises(TypeError, match="data must be a TabularData"):
        make_streaming_split({"X": torch.zeros(3, 1)}, seed=0)


def test_shared_powerplant_protocol(shared_data):
    split = load_streaming_split("powerplant", seed=0, data_dir=shared_data)
    again = load_streaming_split("powerplant", seed=0, data_dir=shared_data)
    assert torch.equal(split.train_X, again.train_X) and torch.equal(split.test_Y, again.test_Y)
    assert split.train_X.shape == (8611, 4) and split.test_X.shape == (957, 4)
    assert split.num_pretrain == 431
    assert split.train_X.abs().max() <= 1.0
    assert abs(split.train_Y.mean().item()) < 1e-12 and abs(split.train_Y.std().item() - 1) < 1e-12
    # Original units come back: PE in MW.
    assert 420 < split.unstandardize_Y(split.test_Y).min() < 500


def test_shared_banana_keeps_its_400_training_points(shared_data):
    split = load_streaming_split("banana", seed=5, data_dir=shared_data, dtype=torch.float32)
    assert split.train_X.shape == (400, 2) and split.test_X.shape == (4900, 2)
    assert split.num_pretrain == 20 and split.train_X.dtype == torch.float32
    assert split.test_index.tolist() == list(range(400, 5300))
    other = load_streaming_split("banana", seed=6, data_dir=shared_data)
    assert not torch.equal(split.train_index, other.train_index)  # only the order changes
    assert sorted(split.train_index.tolist()) == sorted(other.train_index.tolist())


# ---------------------------------------------- SoftKI's Table 1 protocol on user arrays
def test_standardized_split_is_the_paper_protocol():
    X = torch.rand(101, 3, dtype=torch.float64) * torch.tensor([1.0, 10.0, 100.0]) + 5
    X[:, 1] = 2.0  # a constant column is shifted only
    Y = (X[:, :1] ** 2).numpy()  # numpy arrays are accepted
    split = make_standardized_split(X.numpy(), Y, seed=3)
    # Oracle: the permutation written out, statistics of the training rows only.
    order = torch.randperm(101, generator=torch.Generator().manual_seed(3))
    train, test = order[:90], order[90:]
    assert torch.equal(split.train_index, train) and torch.equal(split.test_index, test)
    y = torch.as_tensor(Y).squeeze(-1)
    mu, sd = X[train].mean(0), X[train].std(0)
    sd[1] = 1.0
    torch.testing.assert_close(split.test_X, (X[test] - mu) / sd, rtol=0, atol=1e-12)
    torch.testing.assert_close(split.x_std, sd)
    expected_y = (y[test] - y[train].mean()) / y[train].std()
    torch.testing.assert_close(split.test_Y.squeeze(-1), expected_y, rtol=0, atol=1e-12)
    assert split.train_X.shape == (90, 3) and split.train_Y.shape == (90, 1)
    torch.testing.assert_close(split.train_Y.mean(), torch.tensor(0.0, dtype=torch.float64))
    torch.testing.assert_close(split.train_Y.std(), torch.tensor(1.0, dtype=torch.float64))
    assert (split.train_X[:, 1] == 0).all() and (split.train_X[:, 0].std() - 1).abs() < 1e-12
    torch.testing.assert_close(split.unstandardize_Y(split.test_Y).squeeze(-1), y[test])
    # Deterministic in the seed; dtype follows a float32 X.
    again = make_standardized_split(X.float(), torch.as_tensor(Y).float(), seed=3)
    assert torch.equal(again.test_index, test) and again.train_X.dtype == torch.float32
    assert not torch.equal(make_standardized_split(X, Y, seed=4).test_index, test)


@pytest.mark.parametrize(
    "args,kwargs,error,match",
    [
        ((torch.rand(10), torch.rand(10)), {}, ValueError, "X must be n x d"),
        ((torch.rand(10, 2), torch.rand(9)), {}, ValueError, "Y must be n"),
        ((torch.rand(10, 2), torch.rand(10, 2)), {}, ValueError, "Y must be n"),
        ((torch.full((10, 2), float("nan")), torch.rand(10)), {}, ValueError, "X contains"),
        ((torch.rand(10, 2), torch.rand(10)), {"seed": 1.5}, TypeError, "seed"),
        ((torch.rand(10, 2), torch.rand(10)), {"train_fraction": 1.0}, ValueError, "train_f"),
        ((torch.rand(2, 2), torch.rand(2)), {}, ValueError, "too few"),
        ((["a", "b"], torch.rand(2)), {}, TypeError, "X must be"),
    ],
)
def test_standardized_split_rejects_bad_input(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        make_standardized_split(*args, **kwargs)


def test_load_csv_reads_a_table_of_your_own(tmp_path):
    path = tmp_path / "tiny.csv"
    path.write_text("a,b,label,c\n1,2,0.5,3\n4,5,1.5,6\n7,8,2.5,9\n")
    data = load_csv(path, target="label")
    assert (data.name, data.task, data.is_test) == ("tiny", "regression", None)
    assert data.X.tolist() == [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert data.Y.tolist() == [[0.5], [1.5], [2.5]]
    assert load_csv(path, target="label", features=["c", "a"]).X[:, 0].tolist() == [3, 6, 9]
    for kwargs, error, match in [
        ({"target": "y"}, ValueError, "target 'y'"),
        ({"target": "label", "features": ["a", "z"]}, ValueError, "features"),
        ({"target": "label", "features": ["label"]}, ValueError, "features"),
        ({"target": "label", "features": []}, ValueError, "features"),
    ]:
        with pytest.raises(error, match=match):
            load_csv(path, **kwargs)
    with pytest.raises(FileNotFoundError, match="path"):
        load_csv(tmp_path / "missing.csv", target="label")
    bad = tmp_path / "bad.csv"
    bad.write_text("a,y\n1,2\nx,3\n")
    with pytest.raises(ValueError, match="not all numeric"):
        load_csv(bad, target="y")
    bad.write_text("a,y\n1,2\n,3\n")
    with pytest.raises(ValueError, match="missing"):
        load_csv(bad, target="y")
