"""BoTorch models for online Gaussian-process regression."""

from streamgp.models.osgpr import OnlineSGPR
from streamgp.models.wiski import WiskiGP

__all__ = ["OnlineSGPR", "WiskiGP"]
