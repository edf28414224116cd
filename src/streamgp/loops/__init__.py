"""Loops: Bayesian optimisation, active learning, and the streaming protocols."""

from streamgp.loops.acquisition import AcquisitionOptions
from streamgp.loops.active import ActiveLearningLoop
from streamgp.loops.bo import TEST_FUNCTIONS, BayesOptLoop, make_test_function
from streamgp.loops.surrogates import (
    SURROGATES,
    ExactSurrogate,
    Surrogate,
    WiskiSurrogate,
    make_surrogate,
)

__all__ = [
    "SURROGATES",
    "TEST_FUNCTIONS",
    "AcquisitionOptions",
    "ActiveLearningLoop",
    "BayesOptLoop",
    "ExactSurrogate",
    "Surrogate",
    "WiskiSurrogate",
    "make_surrogate",
    "make_test_function",
]
