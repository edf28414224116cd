"""Interpolation of inputs onto inducing grids (SKI's sparse W)."""

from streamgp.interpolation.grid import CubicGridInterpolation, InterpolationWeights

__all__ = ["CubicGridInterpolation", "InterpolationWeights"]
