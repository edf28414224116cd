"""BoTorch models for online Gaussian-process regression."""

from streamgp.models.wiski import WiskiGP

__all__ = ["WiskiGP"]
