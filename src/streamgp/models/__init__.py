"""BoTorch models for online Gaussian-process regression."""

from streamgp.models.additive_wiski import AdditiveWiskiGP
from streamgp.models.kissgp import KissGP
from streamgp.models.local_gp import LocalGP
from streamgp.models.online_softki import OnlineSoftKIGP
from streamgp.models.osgpr import OnlineSGPR
from streamgp.models.osvgp import OnlineSVGP
from streamgp.models.projection import LearnedProjection, ProjectedKernel
from streamgp.models.softki import SoftKIGP
from streamgp.models.svdgp import DecoupledSVGP
from streamgp.models.wiski import WiskiGP

# After the models: the registry's entries name them.
from streamgp.models.registry import (  # noqa: E402  isort: skip
    ModelSpec,
    get_model_spec,
    register_model,
    registered_models,
    unregister_model,
)

__all__ = [
    "AdditiveWiskiGP",
    "DecoupledSVGP",
    "KissGP",
    "LearnedProjection",
    "ProjectedKernel",
    "LocalGP",
    "ModelSpec",
    "OnlineSGPR",
    "OnlineSoftKIGP",
    "OnlineSVGP",
    "SoftKIGP",
    "WiskiGP",
    "get_model_spec",
    "register_model",
    "registered_models",
    "unregister_model",
]

# After the models: registers BoTorch's pathwise samplers for them.
import streamgp.models.pathwise  # noqa: E402, F401  isort: skip
