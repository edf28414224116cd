"""Marginal likelihoods whose cost does not depend on the number of observations."""

from streamgp.mlls.online_sgpr import OnlineSGPRBound
from streamgp.mlls.woodbury import WoodburyMarginalLogLikelihood

__all__ = ["OnlineSGPRBound", "WoodburyMarginalLogLikelihood"]
