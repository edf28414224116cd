"""Figures: the malaria map (posterior surfaces over longitude/latitude) and who draws it."""

import numpy as np
import pytest
import torch

pytest.importorskip(
    "matplotlib", reason="figures need the plots extra: pip install 'streamgp[plots]'"
)

from streamgp import plotting  # noqa: E402
from streamgp.loops import AcquisitionOptions, ActiveLearningLoop  # noqa: E402
from streamgp.plotting import lonlat_image, plot_malaria_map  # noqa: E402

DTYPE = torch.float64
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def small_atlas(step=8):
    # Every `step`-th cell of the shipped atlas along longitude and latitude: still one
    # regular grid (with the atlas' holes), about 1,000 cells.
    from streamgp.datasets import load_malaria

    data = load_malaria()
    index = torch.round((data.X - data.X.min(0).values) * 12).long()
    keep = ((index % step) == 0).all(-1)
    return data.X[keep], data.Y[keep], data.Yvar[keep]


def small_pool_and_test(full=False, seed=0):
    X, Y, Yvar = small_atlas()
    order = torch.randperm(len(X), generator=torch.Generator().manual_seed(seed))
    pool, test = order[: int(0.9 * len(X))], order[int(0.9 * len(X)) :]
    return X[pool], Y[pool], Yvar[pool], X[test], Y[test]


def make_loop(acquisition="random", cells=None, seed=0):
    pool_X, pool_Y, pool_Yvar, test_X, test_Y = small_pool_and_test()
    if cells is not None:  # scattered inputs instead of the atlas grid
        pool_X = cells[: len(pool_X)]
        test_X = cells[len(pool_X) : len(pool_X) + len(test_X)]
    loop = ActiveLearningLoop(
        pool_X,
        pool_Y,
        test_X,
        test_Y,
        pool_Yvar=pool_Yvar,
        acquisition=acquisition,
        q=3,
        num_init=5,
        num_mc_points=16,
        candidates_per_step=16,
        fit_max_iter=5,
        model_options={"grid_size": 10},
        acquisition_options=AcquisitionOptions(pool_batch_size=16),
        seed=seed,
    )
    loop.run(1)
    return loop


def test_lonlat_image_places_cells_and_leaves_holes():
    lon, lat = np.meshgrid([10.0, 10.5, 11.0], [0.0, 0.5])
    cells = np.stack([lon.ravel(), lat.ravel()], -1)
    lon_edges, lat_edges, image = lonlat_image(cells[:-1], np.arange(5.0))
    assert lon_edges.tolist() == [9.75, 10.25, 10.75, 11.25]
    assert lat_edges.tolist() == [-0.25, 0.25, 0.75]
    assert image[0].tolist() == [0.0, 1.0, 2.0] and image[1, :2].tolist() == [3.0, 4.0]
    assert np.isnan(image[1, 2])
    # The shipped atlas is one regular 5-arcmin grid (every cell in its own pixel).
    X, Y, _ = small_atlas(step=1)
    _, _, atlas = lonlat_image(X.numpy(), Y.numpy())
    assert atlas.shape == (237, 286) and int(np.isfinite(atlas).sum()) == len(X)


def test_lonlat_image_refuses_scattered_cells():
    rng = np.random.default_rng(0)
    assert lonlat_image(rng.uniform(size=(50, 2)), np.zeros(50)) is None
    with pytest.raises(ValueError, match="lonlat must be N x 2"):
        lonlat_image(np.zeros((4, 3)), np.zeros(4))


def test_malaria_map_writes_a_png_with_longitude_latitude_axes(tmp_path):
    runs = {"qNIPV": make_loop("qnipv"), "random": make_loop("random")}
    path = plot_malaria_map(runs, tmp_path / "map.png", title="test")
    assert path == tmp_path / "map.png" and path.read_bytes()[:8] == PNG_MAGIC
    fig = plot_malaria_map(runs)  # no path: the figure
    try:
        maps = [ax for ax in fig.axes if ax.get_xlabel()]  # not the colour bars
        assert len(maps) == 4
        assert {ax.get_xlabel() for ax in maps} == {"longitude"}
        assert {ax.get_ylabel() for ax in maps} == {"latitude"}
        titles = [ax.get_title() for ax in maps]
        assert titles[0] == "qNIPV: posterior mean (n = 8)" and "posterior sd" in titles[1]
        # The mean and sd are surfaces over the grid: one image per map (no scatter).
        assert all(len(ax.collections) == 3 for ax in maps)  # surface, chosen, initial
        # Axes span the atlas region (degrees), not the unit cube.
        assert maps[0].get_xlim()[1] > 30 and maps[0].get_ylim()[0] < -10
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


def test_malaria_map_of_scattered_cells_uses_contours(tmp_path):
    gen = torch.Generator().manual_seed(1)
    cells = torch.rand(2000, 2, generator=gen, dtype=DTYPE) * torch.tensor([20.0, 15.0])
    path = plot_malaria_map(make_loop(cells=cells), tmp_path / "scattered.png")
    assert path.read_bytes()[:8] == PNG_MAGIC


def test_malaria_map_errors_name_the_problem():
    pool_X, pool_Y, _, test_X, test_Y = small_pool_and_test()
    loop = ActiveLearningLoop(pool_X, pool_Y, test_X, test_Y, q=2, num_init=3)
    with pytest.raises(ValueError, match="no model yet"):
        plot_malaria_map({"fresh": loop})
    with pytest.raises(ValueError, match="runs is empty"):
        plot_malaria_map({})


def test_cli_active_draws_the_malaria_map(tmp_path, monkeypatch):
    from streamgp.cli import main
    from streamgp.loops import experiments

    monkeypatch.setattr(experiments, "malaria_pool_and_test", small_pool_and_test)
    calls = []

    def spy(runs, path, **kwargs):
        calls.append((dict(runs), path))
        return plot_malaria_map(runs, path, **kwargs)

    monkeypatch.setattr(plotting, "plot_malaria_map", spy)
    monkeypatch.setattr(plotting, "plot_queries", lambda *a, **k: pytest.fail("scatter drawn"))
    argv = "active --models wiski --acquisitions qnipv,random --steps 1 --q 3 --num-init 5"
    argv += " --num-mc-points 16 --candidates 16 --grid-size 10 --fit-max-iter 5"
    argv += " --no-progress --out"
    main([*argv.split(), str(tmp_path)])
    assert len(calls) == 1
    runs, path = calls[0]
    assert path == tmp_path / "active_malaria_queries.png"
    assert path.read_bytes()[:8] == PNG_MAGIC
    # Each first-trial run, its model restored from its checkpoint (8 observations).
    assert list(runs) == ["wiski / qnipv", "wiski / random"]
    assert all(len(loop.chosen) == 8 and loop.surrogate is not None for loop in runs.values())


def test_other_active_experiments_keep_the_query_scatter(tmp_path, monkeypatch):
    from streamgp.loops.experiments import run_active_experiment

    drawn = []
    monkeypatch.setattr(plotting, "plot_queries", lambda *a, **k: drawn.append(a[-1]))
    monkeypatch.setattr(plotting, "plot_malaria_map", lambda *a, **k: pytest.fail("map drawn"))
    gen = torch.Generator().manual_seed(0)
    X = torch.rand(60, 3, generator=gen, dtype=DTYPE)  # 3 inputs: no map
    Y = X.sum(-1, keepdim=True)
    run_active_experiment(
        X[:50],
        Y[:50],
        X[50:],
        Y[50:],
        models=["exact"],
        acquisitions=["random"],
        steps=1,
        q=2,
        num_init=4,
        fit_max_iter=5,
        out=tmp_path,
        progress=False,
    )
    assert drawn == [tmp_path / "active_queries.png"]


def test_curve_plots_keep_the_session_backend(tmp_path):
    # In a notebook pyplot already runs on the inline backend; drawing a file must not
    # switch it to Agg (later figures would no longer show).
    import matplotlib
    import matplotlib.pyplot as plt
    import pandas as pd

    previous = matplotlib.get_backend()
    plt.switch_backend("svg")
    try:
        frame = pd.DataFrame(
            {
                "model": "wiski",
                "acquisition": "random",
                "trial": 0,
                "step": [0, 1],
                "test_rmse": [1.0, 0.5],
                "step_time": [0.0, 0.1],
            }
        )
        assert plotting.plot_active(frame, tmp_path / "curves.png").read_bytes()[:8] == PNG_MAGIC
        assert matplotlib.get_backend() == "svg"
    finally:
        plt.switch_backend(previous)
