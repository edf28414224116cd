r"""Dense float64 oracles shared by the tests: naive, independent derivations.

- :mod:`oracles.ski`: ``DenseSKIModel``, the SKI posterior with dense solves (WISKI,
  KISS-GP, OnlineSoftKIGP through their interpolation weights).
- :mod:`oracles.sgpr`: the Titsias and Bui et al. bounds and ``DenseQuModel``, the
  predictive of a dense ``q(u)`` (O-SGPR, O-SVGP).
- :mod:`oracles.variational`: sparse variational GP quantities (Titsias 2009; Maddox et
  al. 2021).
- :mod:`oracles.svdgp`: the SVGP ELBO of a decoupled model with equal bases.
- :mod:`oracles.joint`: ``JointGaussianOracle``, a model's own posterior conditioned on
  fantasies by dense Gaussian algebra (the qNIPV / qKG oracle of the contract test).

pytest puts ``tests/`` on the path (``pythonpath`` in ``pyproject.toml``), so tests
``import oracles`` (or ``from oracles.sgpr import ...``).
"""

from oracles.base import (
    DenseOracle,
    gaussian_conditioning,
    hyperparameter_vector,
    prior_variance_gap,
    rel_err,
    without_defaults,
)
from oracles.joint import JointGaussianOracle
from oracles.ski import DenseSKIModel, copy_hyperparameters

__all__ = [
    "hyperparameter_vector",
    "DenseOracle",
    "DenseSKIModel",
    "JointGaussianOracle",
    "copy_hyperparameters",
    "gaussian_conditioning",
    "prior_variance_gap",
    "rel_err",
    "without_defaults",
]
