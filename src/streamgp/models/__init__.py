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

__all__ = [
    "AdditiveWiskiGP",
    "DecoupledSVGP",
    "KissGP",
    "LearnedProjection",
    "ProjectedKernel",
    "LocalGP",
    "OnlineSGPR",
    "OnlineSoftKIGP",
    "OnlineSVGP",
    "SoftKIGP",
    "WiskiGP",
]
