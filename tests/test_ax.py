"""streamgp models in Ax's Client (modular BoTorch), and the streaming surrogate.

Skipped when Ax is not installed (``pip install 'streamgp[ax]'``); CI installs it.
"""

from __future__ import annotations

import logging
import math

import pytest
import torch

pytest.importorskip("ax", reason="Ax is an optional extra: pip install 'streamgp[ax]'")

from ax.adapter.registry import Generators  # noqa: E402
from ax.api import Client, RangeParameterConfig  # noqa: E402
from ax.generation_strategy.generation_strategy import (  # noqa: E402
    GenerationNode,
    GenerationStrategy,
)
from ax.generation_strategy.generator_spec import GeneratorSpec  # noqa: E402
from ax.generation_strategy.transition_criterion import MinTrials  # noqa: E402
from ax.generators.torch.botorch_modular.surrogate import SurrogateSpec  # noqa: E402
from ax.generators.torch.botorch_modular.utils import ModelConfig  # noqa: E402
from botorch.acquisition.logei import qLogExpectedImprovement  # noqa: E402

from streamgp.ax import StreamingSurrogate, streaming_generation_strategy  # noqa: E402
from streamgp.models import (  # noqa: E402
    AdditiveWiskiGP,
    DecoupledSVGP,
    KissGP,
    LocalGP,
    OnlineSGPR,
    OnlineSVGP,
    SoftKIGP,
    WiskiGP,
)

NUM_TRIALS = 12
NUM_INITIAL = 5


@pytest.fixture(autouse=True)
def _quiet_ax():
    logging.getLogger("ax").setLevel(logging.WARNING)


def _branin(x1: float, x2: float) -> float:
    b, c, t = 5.1 / (4 * math.pi**2), 5 / math.pi, 1 / (8 * math.pi)
    return (x2 - b * x1**2 + c * x1 - 6) ** 2 + 10 * (1 - t) * math.cos(x1) + 10


def _client(strategy: GenerationStrategy) -> Client:
    client = Client(random_seed=0)
    client.configure_experiment(
        name="branin",
        parameters=[
            RangeParameterConfig(name="x1", parameter_type="float", bounds=(-5.0, 10.0)),
            RangeParameterConfig(name="x2", parameter_type="float", bounds=(0.0, 15.0)),
        ],
    )
    client.configure_optimization(objective="-branin")
    client.set_generation_strategy(strategy)
    return client


def _run(client: Client, num_trials: int = NUM_TRIALS) -> list[float]:
    values = []
    for _ in range(num_trials):
        for index, parameters in client.get_next_trials(max_trials=1).items():
            value = _branin(parameters["x1"], parameters["x2"])
            client.complete_trial(trial_index=index, raw_data={"branin": value})
            values.append(value)
    return values


def _plain_strategy(model_class: type) -> GenerationStrategy:
    """Ax's modular-BoTorch tutorial setup with only the model class chosen."""
    sobol = GenerationNode(
        name="Sobol",
        generator_specs=[
            GeneratorSpec(generator_enum=Generators.SOBOL, generator_kwargs={"seed": 0})
        ],
        transition_criteria=[
            MinTrials(threshold=NUM_INITIAL, transition_to="MBM", use_all_trials_in_exp=True)
        ],
    )
    spec = SurrogateSpec(model_configs=[ModelConfig(botorch_model_class=model_class)])
    model_based = GenerationNode(
        name="MBM",
        generator_specs=[
            GeneratorSpec(
                generator_enum=Generators.BOTORCH_MODULAR,
                generator_kwargs={"surrogate_spec": spec},
            )
        ],
    )
    return GenerationStrategy(name="plain", nodes=[sobol, model_based])


@pytest.mark.slow
@pytest.mark.parametrize(
    "model_class",
    [WiskiGP, AdditiveWiskiGP, KissGP, OnlineSGPR, OnlineSVGP, DecoupledSVGP, LocalGP, SoftKIGP],
)
def test_model_class_swapped_into_ax_modular_botorch(model_class):
    values = _run(_client(_plain_strategy(model_class)))
    assert len(values) == NUM_TRIALS and all(math.isfinite(v) for v in values)


@pytest.mark.slow
def test_ax_model_options_reach_the_constructor():
    strategy = _plain_strategy(WiskiGP)
    spec = strategy.nodes_by_name["MBM"].generator_specs[0].generator_kwargs["surrogate_spec"]
    spec.model_configs[0].model_options = {"grid_size": 12}
    client = _client(strategy)
    _run(client, NUM_INITIAL + 1)
    adapter = strategy.nodes_by_name["MBM"].generator_specs[0].fitted_adapter
    assert list(adapter.generator.surrogate.model.interpolation.grid_size) == [12, 12]


@pytest.mark.slow
def test_a_matern_kernel_from_ax_in_six_dimensions_is_evaluated_exactly():
    """Ax's ``ModelConfig(covar_module_class=MaternKernel)`` on a 6-D space: the kernel
    reaches a WiskiGP that evaluates it exactly (a product grid would refuse it)."""
    from gpytorch.kernels import MaternKernel

    spec = SurrogateSpec(
        model_configs=[
            ModelConfig(
                botorch_model_class=WiskiGP,
                covar_module_class=MaternKernel,
                covar_module_options={"nu": 2.5, "ard_num_dims": 6},
            )
        ]
    )
    strategy = _plain_strategy(WiskiGP)
    strategy.nodes_by_name["MBM"].generator_specs[0].generator_kwargs["surrogate_spec"] = spec
    client = Client(random_seed=0)
    client.configure_experiment(
        name="sphere6",
        parameters=[
            RangeParameterConfig(name=f"x{i}", parameter_type="float", bounds=(0.0, 1.0))
            for i in range(6)
        ],
    )
    client.configure_optimization(objective="-sphere")
    client.set_generation_strategy(strategy)
    for _ in range(NUM_INITIAL + 2):
        for index, parameters in client.get_next_trials(max_trials=1).items():
            value = sum((v - 0.3) ** 2 for v in parameters.values())
            client.complete_trial(trial_index=index, raw_data={"sphere": value})
    adapter = strategy.nodes_by_name["MBM"].generator_specs[0].fitted_adapter
    model = adapter.generator.surrogate.model
    assert isinstance(model.covar_module, MaternKernel) and model.evaluates_kernel_exactly
    assert model.num_train == NUM_INITIAL + 1


@pytest.mark.slow
@pytest.mark.parametrize(
    "model_class, acqf_class",
    [(WiskiGP, None), (OnlineSGPR, None), (WiskiGP, qLogExpectedImprovement)],
    ids=["WiskiGP", "OnlineSGPR", "WiskiGP-qLogEI"],
)
def test_streaming_surrogate_absorbs_only_new_trials(model_class, acqf_class):
    strategy = streaming_generation_strategy(
        model_class, refit_every=4, seed=0, botorch_acqf_class=acqf_class
    )
    spec = strategy.nodes_by_name["MBM"].generator_specs[0]
    surrogate = spec.generator_kwargs["surrogate"]
    assert isinstance(surrogate, StreamingSurrogate)
    values = _run(_client(strategy))
    if acqf_class is not None:
        assert spec.fitted_adapter.generator.botorch_acqf_class is acqf_class
    assert all(math.isfinite(v) for v in values)
    # One model built from the Sobol trials; each later trial absorbed once, by observe.
    num_model_based = NUM_TRIALS - NUM_INITIAL
    assert surrogate.num_constructions == 1
    assert surrogate.num_updates == num_model_based - 1
    assert surrogate.num_absorbed == num_model_based - 1
    assert surrogate.num_refits == (num_model_based - 1) // 4
    model = surrogate.model
    assert model.num_train == NUM_TRIALS - 1  # the last trial completed after the last fit


def test_streaming_surrogate_rebuilds_when_old_rows_change():
    from botorch.utils.datasets import SupervisedDataset

    from streamgp.ax import _extends

    X, Y = torch.rand(6, 2, dtype=torch.float64), torch.rand(6, 1, dtype=torch.float64)

    def dataset(X, Y):
        return SupervisedDataset(X, Y, feature_names=["a", "b"], outcome_names=["y"])

    assert _extends(dataset(X, Y), dataset(X[:4], Y[:4]))
    assert not _extends(dataset(X, Y + 1), dataset(X[:4], Y[:4]))  # re-standardised rows
    assert not _extends(dataset(X[:4], Y[:4]), dataset(X[:4], Y[:4]))  # nothing new
    with pytest.raises(ValueError, match="refit_every"):
        StreamingSurrogate(refit_every=0)


@pytest.mark.slow
def test_a_client_with_a_streamgp_model_saves_and_loads(tmp_path):
    from streamgp.ax import MODEL_CLASSES

    assert WiskiGP in MODEL_CLASSES and OnlineSGPR in MODEL_CLASSES
    client = _client(_plain_strategy(WiskiGP))
    _run(client, NUM_INITIAL + 2)
    path = tmp_path / "client.json"
    client.save_to_json_file(str(path))
    loaded = Client.load_from_json_file(str(path))
    _run(loaded, 1)  # the loaded strategy rebuilds the WiskiGP and proposes a trial
    assert len(loaded._experiment.trials) == NUM_INITIAL + 3


@pytest.mark.slow
def test_a_client_with_the_streaming_strategy_saves_and_loads(tmp_path):
    strategy = streaming_generation_strategy(WiskiGP, refit_every=3, seed=0)
    client = _client(strategy)
    _run(client, NUM_INITIAL + 2)
    path = tmp_path / "client.json"
    client.save_to_json_file(str(path))
    loaded = Client.load_from_json_file(str(path))
    node = loaded._generation_strategy.nodes_by_name["MBM"]
    surrogate = node.generator_specs[0].generator_kwargs["surrogate"]
    assert isinstance(surrogate, StreamingSurrogate) and surrogate.refit_every == 3
    _run(loaded, 3)
    # The kept model is not stored: the first generation after loading rebuilds it from
    # every completed trial, later ones absorb the new trials.
    assert surrogate.num_constructions == 1
    assert surrogate.num_updates == 2
    assert surrogate.model.num_train == NUM_INITIAL + 4
    assert len(loaded._experiment.trials) == NUM_INITIAL + 5


def test_several_metrics_on_the_same_points_get_a_model_list():
    # WiskiGP is a BatchedMultiOutputGPyTorchModel (SingleTaskGP's layout for several
    # outputs), which Ax would batch over metrics; it asks for a ModelListGP instead: one
    # single-output model per metric, in data space while n is small.
    from ax.core.search_space import SearchSpaceDigest
    from ax.generators.torch.botorch_modular.utils import use_model_list
    from botorch.utils.datasets import SupervisedDataset

    X = torch.rand(10, 2, dtype=torch.float64)
    datasets = [
        SupervisedDataset(X, X[:, :1] + i, feature_names=["x0", "x1"], outcome_names=[f"y{i}"])
        for i in range(2)
    ]
    digest = SearchSpaceDigest(feature_names=["x0", "x1"], bounds=[(0.0, 1.0)] * 2)
    configs = [ModelConfig(botorch_model_class=WiskiGP)]
    assert use_model_list(datasets, digest, model_configs=configs)
