"""Command line: argument errors are clear; a tiny BO run writes its outputs."""

import pandas as pd
import pytest

from streamgp.cli import main


@pytest.mark.parametrize(
    "argv, message",
    [
        (["bo", "--function", "branin9"], "invalid choice: 'branin9'"),
        (["bo", "--models", "wiski,gpt"], "unknown model ['gpt']"),
        (["bo", "--steps", "0"], "expected a positive integer, got '0'"),
        (["bo", "--max-steps", "exact:3"], "expected model=N"),
        (["bo", "--acquisition", "ei"], "needs --q 1"),
        (["bo", "--first-trial", "-1"], "expected a non-negative integer, got '-1'"),
        (["active", "--acquisitions", "qnipv,ucb"], "unknown acquisition ['ucb']"),
        (["active", "--dataset", "mars"], "unknown dataset 'mars'"),
        (["active", "--pool-batch-size", "0"], "expected a positive integer, got '0'"),
        (["fly"], "invalid choice: 'fly'"),
    ],
)
def test_argument_errors_are_clear(argv, message, capsys):
    with pytest.raises(SystemExit) as error:
        main(argv)
    captured = capsys.readouterr()
    assert message in captured.err + str(error.value)


def test_tiny_bo_run_writes_csv_and_summary(tmp_path, capsys):
    argv = "bo --function ackley --models wiski,osvgp,exact --steps 2 --grid-size 6"
    argv += " --num-inducing 8 --num-restarts 2 --raw-samples 16 --maxiter 5 --fit-max-iter 5"
    argv += " --first-trial 3 --no-progress --no-plots --out"
    main([*argv.split(), str(tmp_path)])
    results = pd.read_csv(tmp_path / "bo_ackley_qucb.csv")
    assert set(results["model"]) == {"wiski", "osvgp", "exact"} and results["step"].max() == 2
    assert set(results["trial"]) == {3}
    assert (tmp_path / "checkpoints").is_dir()
    assert "best_value" in capsys.readouterr().out


def test_models_auto_follows_the_dimension_and_the_runs_length(tmp_path, capsys):
    # 6-D, 6 + 2 x 3 = 12 observations: a short run, so WISKI in data space.
    argv = "bo --function ackley --dim 6 --models auto,exact --steps 2 --num-init 6"
    argv += " --num-restarts 2 --raw-samples 16 --maxiter 5 --fit-max-iter 5"
    argv += " --no-progress --no-plots --out"
    main([*argv.split(), str(tmp_path)])
    results = pd.read_csv(tmp_path / "bo_ackley_qucb.csv")
    assert set(results["model"]) == {"wiski", "exact"} and results["step"].max() == 2
    assert "--models auto: wiski (6-D inputs, at most 12 observations)" in capsys.readouterr().out
    from streamgp.cli import _final_observations, _resolve_models, build_parser
    from streamgp.models.registry import AUTO_DATA_SPACE_MAX_OBSERVATIONS as LIMIT

    assert _resolve_models(["auto", "wiski"], 2, 10**6) == ["wiski"]
    assert _resolve_models(["auto"], 6, LIMIT) == ["wiski"]
    assert _resolve_models(["auto", "exact"], 6, LIMIT + 1) == ["wiski-additive", "exact"]
    args = build_parser().parse_args("bo --num-init 7 --steps 40 --q 5".split())
    assert _final_observations(args) == 7 + 40 * 5


def test_active_pool_batch_size_reaches_the_acquisition_options():
    from streamgp.cli import _acquisition_options, build_parser
    from streamgp.loops import AcquisitionOptions

    args = build_parser().parse_args(["active", "--pool-batch-size", "8"])
    assert _acquisition_options(args).pool_batch_size == 8
    bo_args = build_parser().parse_args(["bo"])
    assert _acquisition_options(bo_args).pool_batch_size == AcquisitionOptions.pool_batch_size


def test_model_size_options_reach_their_models():
    from streamgp.cli import _model_options, build_parser

    args = build_parser().parse_args(["bo", "--grid-size", "7", "--num-inducing", "9"])
    options = _model_options(args)
    assert options["wiski"] == options["wiski-additive"] == options["kissgp"] == {"grid_size": 7}
    assert options["osvgp"] == options["softki"] == {"num_inducing": 9}
    assert options["exact"] == {}  # each model gets the flags it takes (the registry's)
    defaults = _model_options(build_parser().parse_args(["bo"]))
    assert not any(defaults.values())
    assert _model_options(build_parser().parse_args(["active"]), grid_size=30)["wiski"] == {
        "grid_size": 30
    }


@pytest.mark.parametrize(
    "argv, message",
    [
        (["bo", "--workers", "0"], "expected a positive integer, got '0'"),
        (["bo", "--workers", "2", "--scheduler", "tcp://x:8786"], "not allowed with argument"),
        (["active", "--processes", "2", "--workers", "2"], "not allowed with argument"),
        (["stream", "--torch-threads", "0"], "expected a positive integer, got '0'"),
    ],
)
def test_parallel_option_errors_are_clear(argv, message, capsys):
    with pytest.raises(SystemExit):
        main(argv)
    assert message in capsys.readouterr().err


def test_parallel_options_choose_the_executor():
    from streamgp.cli import _executor, build_parser
    from streamgp.loops.executors import ProcessExecutor, SequentialExecutor

    for command in ("bo", "active", "stream"):
        args = build_parser().parse_args([command])
        with _executor(args) as executor:
            assert isinstance(executor, SequentialExecutor) and executor.torch_threads is None
    args = build_parser().parse_args(["bo", "--processes", "3", "--torch-threads", "2"])
    with _executor(args) as executor:
        assert isinstance(executor, ProcessExecutor)
        assert (executor.workers, executor.torch_threads) == (3, 2)


@pytest.mark.slow
def test_bo_with_two_dask_workers_gives_the_sequential_csv(tmp_path, capsys):
    pytest.importorskip(
        "distributed", reason="--workers needs dask[distributed] (pip install 'streamgp[cluster]')"
    )
    argv = "bo --function levy --models wiski,exact --trials 2 --steps 2 --q 2 --num-init 4"
    argv += " --grid-size 6 --num-restarts 2 --raw-samples 16 --batch-limit 2 --maxiter 5"
    argv += " --fit-max-iter 5 --no-plots --no-progress --out"
    main([*argv.split(), str(tmp_path / "seq"), "--torch-threads", "1"])
    main([*argv.split(), str(tmp_path / "dask"), "--workers", "2"])
    sequential = pd.read_csv(tmp_path / "seq" / "bo_levy_qucb.csv")
    parallel = pd.read_csv(tmp_path / "dask" / "bo_levy_qucb.csv")
    assert len(parallel) == 2 * 2 * 3
    assert not parallel.duplicated(["model", "trial", "step"]).any()
    same = [column for column in sequential if not column.endswith("_time")]
    pd.testing.assert_frame_equal(parallel[same], sequential[same])
    assert "best_value" in capsys.readouterr().out


@pytest.mark.slow
def test_bo_on_an_existing_scheduler_gives_the_sequential_csv(tmp_path):
    distributed = pytest.importorskip(
        "distributed",
        reason="--scheduler needs dask[distributed] (pip install 'streamgp[cluster]')",
    )
    argv = "bo --function levy --models wiski --trials 2 --steps 2 --q 2 --num-init 4"
    argv += " --grid-size 6 --num-restarts 2 --raw-samples 16 --batch-limit 2 --maxiter 5"
    argv += " --fit-max-iter 5 --no-plots --no-progress --torch-threads 1 --out"
    main([*argv.split(), str(tmp_path / "seq")])
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    ) as cluster:
        main([*argv.split(), str(tmp_path / "remote"), "--scheduler", cluster.scheduler_address])
    sequential = pd.read_csv(tmp_path / "seq" / "bo_levy_qucb.csv")
    remote = pd.read_csv(tmp_path / "remote" / "bo_levy_qucb.csv")
    same = [column for column in sequential if not column.endswith("_time")]
    pd.testing.assert_frame_equal(remote[same], sequential[same])
