"""streamgp: online Gaussian-process surrogates for BoTorch.

Models absorb new observations in time that does not depend on how many they have
already seen; see :class:`streamgp.models.WiskiGP`.
"""

from streamgp.mlls import WoodburyMarginalLogLikelihood
from streamgp.models import AdditiveWiskiGP, KissGP, WiskiGP

__version__ = "0.1.0"
__all__ = ["AdditiveWiskiGP", "KissGP", "WiskiGP", "WoodburyMarginalLogLikelihood", "__version__"]
