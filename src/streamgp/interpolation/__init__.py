"""Interpolation of inputs onto inducing grids (SKI's sparse W)."""

from streamgp.interpolation.exact import ExactKernelInputs, InputRows
from streamgp.interpolation.grid import CubicGridInterpolation, InterpolationWeights
from streamgp.interpolation.protocols import Interpolation, InterpolationRows

__all__ = [
    "CubicGridInterpolation",
    "ExactKernelInputs",
    "InputRows",
    "Interpolation",
    "InterpolationRows",
    "InterpolationWeights",
]
