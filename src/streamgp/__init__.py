"""streamgp: online Gaussian-process surrogates for BoTorch.

Models absorb new observations in time that does not depend on how many they have
already seen; see :class:`streamgp.models.WiskiGP`. Every model of
:mod:`streamgp.models` is importable from here too (``from streamgp import SoftKIGP``).
"""

from streamgp.mlls import WoodburyMarginalLogLikelihood
from streamgp.models import (
    AdditiveWiskiGP,
    DecoupledSVGP,
    KissGP,
    LocalGP,
    OnlineSGPR,
    OnlineSoftKIGP,
    OnlineSVGP,
    SoftKIGP,
    WiskiGP,
)

__version__ = "0.1.0"
__all__ = [
    "AdditiveWiskiGP",
    "DecoupledSVGP",
    "KissGP",
    "LocalGP",
    "OnlineSGPR",
    "OnlineSVGP",
    "OnlineSoftKIGP",
    "SoftKIGP",
    "WiskiGP",
    "WoodburyMarginalLogLikelihood",
    "__version__",
]
