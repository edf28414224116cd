"""Loops: Bayesian optimisation, active learning, and the streaming protocols."""

from streamgp.loops.acquisition import AcquisitionOptions
from streamgp.loops.active import ActiveLearningLoop
from streamgp.loops.bo import PAPER_FUNCTIONS, TEST_FUNCTIONS, BayesOptLoop, make_test_function
from streamgp.loops.executors import (
    DaskExecutor,
    Executor,
    ProcessExecutor,
    SequentialExecutor,
    make_executor,
)
from streamgp.loops.stream import (
    STREAM_MODELS,
    StreamConfig,
    StreamingLoop,
    dirichlet_targets,
    run_stream_experiment,
)
from streamgp.loops.surrogates import Surrogate, make_surrogate, surrogate_names

__all__ = [
    "STREAM_MODELS",
    "PAPER_FUNCTIONS",
    "TEST_FUNCTIONS",
    "AcquisitionOptions",
    "ActiveLearningLoop",
    "BayesOptLoop",
    "DaskExecutor",
    "Executor",
    "ProcessExecutor",
    "SequentialExecutor",
    "StreamConfig",
    "StreamingLoop",
    "Surrogate",
    "dirichlet_targets",
    "make_executor",
    "make_surrogate",
    "make_test_function",
    "surrogate_names",
    "run_stream_experiment",
]
