r"""Streaming surrogates for Ax: the model is kept between trials and absorbs only new ones.

Every streamgp model works as ``ModelConfig(botorch_model_class=WiskiGP)`` in Ax's
modular BoTorch setup with no other option. Ax then rebuilds and refits the model from
all trials at every ``get_next_trials`` call, so a long experiment's per-trial cost grows
with ``n`` whatever the model. :class:`StreamingSurrogate` keeps the model instead: when
the trials Ax hands it extend the previous ones row for row, the model absorbs the new
rows with ``observe`` (``O(m^2 q)`` for WISKI) and its hyperparameters are refitted every
``refit_every`` absorbed trials. :func:`streaming_generation_strategy` builds the whole
strategy (Sobol initial trials, then the streaming surrogate).

Old rows only stay fixed if Ax's adapter does not re-standardise the outcomes from all
trials, so the strategy leaves out Ax's ``Winsorize`` and ``StandardizeY`` transforms and
gives the model a BoTorch ``Standardize``, which streamgp fits on the first batch and
freezes. Importing this module also registers streamgp's models with Ax's storage, so
a ``Client`` whose ``ModelConfig`` names one can be saved with ``save_to_json_file``.
Requires the optional extra: ``pip install "streamgp[ax]"`` (Ax 1.3.1, the release that
pins BoTorch 0.18.1).

Example:
    >>> from ax.api import Client, RangeParameterConfig
    >>> from streamgp import WiskiGP
    >>> from streamgp.ax import streaming_generation_strategy
    >>> client = Client()
    >>> client.configure_experiment(parameters=[
    ...     RangeParameterConfig(name="x1", parameter_type="float", bounds=(-5.0, 10.0)),
    ...     RangeParameterConfig(name="x2", parameter_type="float", bounds=(0.0, 15.0))])
    >>> client.configure_optimization(objective="-branin")
    >>> client.set_generation_strategy(streaming_generation_strategy(WiskiGP))
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

try:
    from ax.adapter.registry import Generators, MBM_X_trans
    from ax.adapter.transforms.bilog_y import BilogY
    from ax.adapter.transforms.derelativize import Derelativize
    from ax.generation_strategy.generation_strategy import GenerationNode, GenerationStrategy
    from ax.generation_strategy.generator_spec import GeneratorSpec
    from ax.generation_strategy.transition_criterion import MinTrials
    from ax.generators.torch.botorch_modular.surrogate import Surrogate, SurrogateSpec
    from ax.generators.torch.botorch_modular.utils import (
        ModelConfig,
        copy_model_config_with_default_values,
        fit_botorch_model,
    )
    from ax.storage.botorch_modular_registry import register_model
    from ax.storage.json_store.encoders import surrogate_to_dict
    from ax.storage.json_store.registry import CORE_DECODER_REGISTRY, CORE_ENCODER_REGISTRY
except ImportError as error:  # pragma: no cover - exercised without the extra
    raise ImportError(
        "streamgp.ax needs Ax: pip install 'streamgp[ax]' (ax-platform 1.3.1)."
    ) from error
from botorch.models.transforms.outcome import Standardize

from streamgp.models.registry import (
    get_model_spec,
    registered_models,
    restandardize_before_refit,
)
from streamgp.utils.validation import check_count

#: streamgp's BoTorch model classes (the registry's, BoTorch's own left to Ax), as Ax's
#: storage registry knows them after :func:`register_with_ax_storage`.
MODEL_CLASSES = tuple(
    dict.fromkeys(
        spec.model_class
        for spec in map(get_model_spec, registered_models())
        if spec.model_class.__module__.startswith("streamgp.")
    )
)


def register_with_ax_storage() -> None:
    r"""Add streamgp's model classes to Ax's JSON/SQL registries (done on import).

    Without it ``client.save_to_json_file`` fails on any ``ModelConfig`` naming a
    streamgp model (Ax stores the class by its registered name). A strategy holding a
    :class:`StreamingSurrogate` saves its settings (surrogate spec, ``refit_every``);
    the kept model is not saved: after loading, the first generation rebuilds it from
    all the experiment's trials, as Ax's own ``Surrogate`` does.
    """
    for model_class in MODEL_CLASSES:
        register_model(model_class)
    # Ax's encoder looks classes up by exact type, its decoder by the stored name.
    CORE_ENCODER_REGISTRY[StreamingSurrogate] = surrogate_to_dict
    CORE_DECODER_REGISTRY[StreamingSurrogate.__name__] = StreamingSurrogate


#: Ax's adapter transforms for a streaming model: its modular-BoTorch defaults without
#: ``Winsorize`` and ``StandardizeY``, which recompute every outcome from all trials.
STREAMING_TRANSFORMS = [*MBM_X_trans, Derelativize, BilogY]


def _extends(new: Any, old: Any) -> bool:
    r"""Whether dataset ``new`` is ``old`` with rows appended (same features, outcomes)."""
    n = old.X.shape[0]
    if (
        new.X.shape[0] <= n
        or list(new.feature_names) != list(old.feature_names)
        or list(new.outcome_names) != list(old.outcome_names)
        or (new.Yvar is None) != (old.Yvar is None)
    ):
        return False
    same = torch.equal(new.X[:n], old.X) and torch.equal(new.Y[:n], old.Y)
    return same and (old.Yvar is None or torch.equal(new.Yvar[:n], old.Yvar))


class StreamingSurrogate(Surrogate):
    r"""An Ax ``Surrogate`` whose streamgp models absorb new trials instead of being rebuilt.

    Ax keeps one surrogate object for the whole experiment when it is passed as
    ``generator_kwargs={"surrogate": StreamingSurrogate(...)}``. At each generation,
    per outcome: if the model built before can ``observe`` and the new dataset extends
    the old one row for row, only the new rows are absorbed, and the hyperparameters are
    refitted (Ax's ``fit_botorch_model``, i.e. ``fit_gpytorch_mll``) once ``refit_every``
    trials have been absorbed since the last fit (after re-estimating the outcome's
    ``Standardize`` from every trial, where the model has ``restandardize``, as Ax's
    rebuilt models are re-standardised). Anything else (first generation,
    changed old rows, a state dict from cross-validation) builds and fits the model as
    Ax's ``Surrogate`` does.

    Args:
        surrogate_spec: As Ax's ``Surrogate``.
        refit_every: Refit the hyperparameters after this many absorbed trials (a
            positive int), or never (``None``).
        **kwargs: Further keyword arguments of Ax's ``Surrogate``.

    Attributes:
        num_constructions: Models built (and fitted) from all trials.
        num_updates: ``observe`` calls on a kept model.
        num_absorbed: Trials (rows) absorbed by those calls.
        num_refits: Hyperparameter refits of a kept model.
    """

    def __init__(
        self,
        surrogate_spec: SurrogateSpec | None = None,
        refit_every: int | None = 10,
        **kwargs: Any,
    ) -> None:
        check_count(refit_every, "refit_every", minimum=1, allow_none=True)
        super().__init__(surrogate_spec=surrogate_spec, **kwargs)
        self.refit_every = refit_every
        self.num_constructions = 0
        self.num_updates = 0
        self.num_absorbed = 0
        self.num_refits = 0
        self._absorbed_since_fit: dict[tuple[str, ...], int] = {}

    def _construct_model(
        self,
        dataset: Any,
        search_space_digest: Any,
        model_config: ModelConfig,
        state_dict: Mapping[str, Tensor] | None,
        refit: bool,
    ) -> Any:
        key = tuple(dataset.outcome_names)
        model, old = self._submodels.get(key), self._last_datasets.get(key)
        if (
            state_dict is None
            and model is not None
            and old is not None
            and callable(getattr(model, "observe", None))
            and _extends(dataset, old)
        ):
            n = old.X.shape[0]
            Yvar = None if dataset.Yvar is None else dataset.Yvar[n:]
            if Yvar is None:
                model.observe(dataset.X[n:], dataset.Y[n:])
            else:
                model.observe(dataset.X[n:], dataset.Y[n:], Yvar)
            self.num_updates += 1
            self.num_absorbed += dataset.X.shape[0] - n
            since = self._absorbed_since_fit.get(key, 0) + dataset.X.shape[0] - n
            if self.refit_every is not None and since >= self.refit_every:
                config = copy_model_config_with_default_values(
                    model_config=model_config,
                    dataset=dataset,
                    search_space_digest=search_space_digest,
                )
                restandardize_before_refit(model)  # as the package's loops do
                fit_botorch_model(model, mll_class=config.mll_class, mll_options=config.mll_options)
                self.num_refits += 1
                since = 0
            self._absorbed_since_fit[key] = since
            return model
        model = super()._construct_model(
            dataset=dataset,
            search_space_digest=search_space_digest,
            model_config=model_config,
            state_dict=state_dict,
            refit=refit,
        )
        self.num_constructions += 1
        self._absorbed_since_fit[key] = 0
        return model

    def _serialize_attributes_as_kwargs(self) -> dict[str, Any]:
        r"""What Ax's storage saves and passes back to ``__init__`` on loading."""
        return {**super()._serialize_attributes_as_kwargs(), "refit_every": self.refit_every}


register_with_ax_storage()


def streaming_generation_strategy(
    botorch_model_class: type,
    *,
    num_initial_trials: int = 5,
    refit_every: int | None = 10,
    model_options: dict[str, Any] | None = None,
    seed: int | None = None,
    botorch_acqf_class: type | None = None,
) -> GenerationStrategy:
    r"""Sobol initial trials, then BoTorch acquisition on a :class:`StreamingSurrogate`.

    Args:
        botorch_model_class: A streamgp model class (e.g. ``WiskiGP``); any class works,
            and one without ``observe`` is rebuilt at every generation as in Ax.
        num_initial_trials: Sobol trials before the first model.
        refit_every: See :class:`StreamingSurrogate`.
        model_options: Keyword arguments of the model's constructor (e.g.
            ``{"grid_size": 16}``).
        seed: Seed of the Sobol sequence.
        botorch_acqf_class: The BoTorch acquisition function (default: Ax's choice,
            qLogNEI for one objective). qLogNEI integrates over the noisy values at all
            ``n`` previous trials, so its cost grows with ``n`` whatever the model;
            ``qLogExpectedImprovement`` (best observed value, no baseline) keeps the
            acquisition's cost flat too (``benchmarks/ax_streaming.py``).

    Returns:
        The generation strategy, for ``client.set_generation_strategy``. Its surrogate
        (with the update counters) is
        ``strategy.nodes_by_name["MBM"].generator_specs[0].generator_kwargs["surrogate"]``.
    """
    check_count(num_initial_trials, "num_initial_trials", minimum=1)
    surrogate = StreamingSurrogate(
        surrogate_spec=SurrogateSpec(
            model_configs=[
                ModelConfig(
                    botorch_model_class=botorch_model_class,
                    model_options=dict(model_options or {}),
                    outcome_transform_classes=[Standardize],
                    name=botorch_model_class.__name__,
                )
            ]
        ),
        refit_every=refit_every,
    )
    sobol = GenerationNode(
        name="Sobol",
        generator_specs=[
            GeneratorSpec(generator_enum=Generators.SOBOL, generator_kwargs={"seed": seed})
        ],
        transition_criteria=[
            MinTrials(threshold=num_initial_trials, transition_to="MBM", use_all_trials_in_exp=True)
        ],
    )
    generator_kwargs = {"surrogate": surrogate, "transforms": STREAMING_TRANSFORMS}
    if botorch_acqf_class is not None:
        generator_kwargs["botorch_acqf_class"] = botorch_acqf_class
    model_based = GenerationNode(
        name="MBM",
        generator_specs=[
            GeneratorSpec(
                generator_enum=Generators.BOTORCH_MODULAR, generator_kwargs=generator_kwargs
            )
        ],
    )
    return GenerationStrategy(
        name=f"Sobol+streaming {botorch_model_class.__name__}", nodes=[sobol, model_based]
    )
