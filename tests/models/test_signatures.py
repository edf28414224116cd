r"""One way to build and update a model: the signatures every exported model shares.

* ``__init__`` takes BoTorch's ``SingleTaskGP`` arguments positionally, in
  ``SingleTaskGP``'s order (``train_X, train_Y, train_Yvar, likelihood, covar_module,
  outcome_transform, input_transform``, those a model has), and everything else
  keyword-only. ``mean_module``, 6th in ``SingleTaskGP``, is keyword-only in every
  streamgp model (one convention; Ax builds no mean modules, and finds the arguments it
  does build with ``inspect.getfullargspec(cls).args``).
* ``observe`` is ``observe(self, X, Y, Yvar=None, *, ...)``: a streaming caller passes
  ``Yvar`` positionally to any model (learned-noise models refuse a given ``Yvar``) and
  model-specific options (``num_steps``) only by keyword.
"""

import inspect

import pytest
import torch
from botorch.models import SingleTaskGP
from botorch.models.model import Model

import streamgp.models

POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
KEYWORD_ONLY_IN_STREAMGP = {"mean_module"}
SINGLE_TASK_GP_ORDER = [
    name
    for name, p in inspect.signature(SingleTaskGP.__init__).parameters.items()
    if name != "self" and p.kind in POSITIONAL and name not in KEYWORD_ONLY_IN_STREAMGP
]

MODELS = [
    cls
    for cls in (getattr(streamgp.models, name) for name in streamgp.models.__all__)
    if inspect.isclass(cls) and issubclass(cls, Model)
]
STREAMING_MODELS = [cls for cls in MODELS if hasattr(cls, "observe")]


def _parameters(function) -> list[inspect.Parameter]:
    return list(inspect.signature(function).parameters.values())


def test_the_order_is_single_task_gps():
    assert SINGLE_TASK_GP_ORDER == [
        "train_X",
        "train_Y",
        "train_Yvar",
        "likelihood",
        "covar_module",
        "outcome_transform",
        "input_transform",
    ]
    assert {m.__name__ for m in MODELS} >= {"WiskiGP", "OnlineSVGP", "DecoupledSVGP"}
    assert "SoftKIGP" not in {m.__name__ for m in STREAMING_MODELS}  # not a streaming model


@pytest.mark.parametrize("model_cls", MODELS, ids=lambda cls: cls.__name__)
def test_init_takes_single_task_gps_arguments_positionally_and_the_rest_by_keyword(model_cls):
    parameters = _parameters(model_cls.__init__)
    assert parameters[0].name == "self"
    positional = [p.name for p in parameters[1:] if p.kind in POSITIONAL]
    names = {p.name for p in parameters}
    assert positional == [name for name in SINGLE_TASK_GP_ORDER if name in names]
    assert positional[:2] == ["train_X", "train_Y"]
    rest = [p for p in parameters[1:] if p.name not in positional]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in rest), rest
    # Every optional BoTorch argument defaults as in SingleTaskGP (None or DEFAULT).
    reference = inspect.signature(SingleTaskGP.__init__).parameters
    for p in parameters[3:]:
        if p.name in reference:
            assert p.default is reference[p.name].default, p.name


@pytest.mark.parametrize("model_cls", STREAMING_MODELS, ids=lambda cls: cls.__name__)
def test_observe_is_X_Y_Yvar_then_keywords(model_cls):
    parameters = _parameters(model_cls.observe)
    assert [p.name for p in parameters[:4]] == ["self", "X", "Y", "Yvar"]
    assert all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in parameters[:4])
    assert parameters[1].default is inspect.Parameter.empty
    assert parameters[2].default is inspect.Parameter.empty
    assert parameters[3].default is None
    rest = parameters[4:]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in rest), rest


def test_learned_noise_models_refuse_a_positional_Yvar_by_name():
    from streamgp.models import DecoupledSVGP, LocalGP, OnlineSVGP

    X = torch.rand(8, 1, dtype=torch.float64)
    Y = torch.sin(6 * X)
    for model in (
        OnlineSVGP(X, Y, num_inducing=4, num_init_steps=0),
        DecoupledSVGP(X, Y, max_covar_basis=4, num_init_steps=0),
        LocalGP(X, Y),
    ):
        name = type(model).__name__
        with pytest.raises(ValueError, match=f"Yvar must be None: {name} learns"):
            model.observe(X[:2], Y[:2], torch.full_like(Y[:2], 0.1))
