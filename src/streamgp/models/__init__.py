"""BoTorch models for online Gaussian-process regression."""

from streamgp.models.osvgp import OnlineSVGP
from streamgp.models.wiski import WiskiGP

__all__ = ["OnlineSVGP", "WiskiGP"]
