"""Interpolation of inputs onto inducing grids (SKI's sparse W)."""

from streamgp.interpolation.grid import CubicGridInterpolation, InterpolationWeights
from streamgp.interpolation.protocols import Interpolation, InterpolationRows

__all__ = ["CubicGridInterpolation", "Interpolation", "InterpolationRows", "InterpolationWeights"]
