r"""What every streamgp model shares: posterior template, transforms, views, caches, rollback.

- :mod:`~streamgp.models.utils.posterior`: BoTorch's ``posterior`` as one template
  (:class:`PosteriorMixin`) and the assembly of a latent posterior into BoTorch's
  (observation noise, outcome untransform, structured covariances).
- :mod:`~streamgp.models.utils.transforms`: input and outcome transforms fitted on the
  constructor's data and then frozen (:class:`FrozenTransformsMixin`).
- :mod:`~streamgp.models.utils.defaults`: BoTorch's ``SingleTaskGP`` kernel and
  likelihood as model defaults.
- :mod:`~streamgp.models.utils.views`: conditioned models as views (no copies).
- :mod:`~streamgp.models.utils.cache`: caches valid while the hyperparameters are, and
  the plumbing that drops them (:class:`CachedPosteriorMixin`).
- :mod:`~streamgp.models.utils.transaction`: updates that leave the model as it was
  when they fail.
- :mod:`~streamgp.models.utils.optimization`: the per-batch optimizer the streaming
  variational models keep between batches.
- :mod:`~streamgp.models.utils.observations`: the raw observations a grid model keeps
  for exact re-grids.
- :mod:`~streamgp.models.utils.grids`: the default grid of a grid model (its size and
  box) and the grid it builds.
"""

from streamgp.models.utils.cache import (
    CachedPosteriorMixin,
    apply_to_tensors,
    invalidate_after_load,
    parameter_snapshot,
    parameters_unchanged,
)
from streamgp.models.utils.defaults import kernel_and_likelihood_or_defaults
from streamgp.models.utils.posterior import (
    PosteriorMixin,
    assemble_posterior,
    assemble_root_posterior,
    check_latent_only,
)
from streamgp.models.utils.transaction import MutableState, TransactionalMixin, transaction
from streamgp.models.utils.transforms import (
    FrozenTransformsMixin,
    eval_mode,
    fit_frozen_transforms,
    transform_new_data,
)
from streamgp.models.utils.views import (
    JointConditioningMixin,
    append_conditioning,
    condition_joint,
    conditioning_batch_shape,
    conditioning_noise,
    correction_batch_shape,
    shallow_view,
)

__all__ = [
    "CachedPosteriorMixin",
    "FrozenTransformsMixin",
    "JointConditioningMixin",
    "MutableState",
    "PosteriorMixin",
    "TransactionalMixin",
    "append_conditioning",
    "apply_to_tensors",
    "assemble_posterior",
    "assemble_root_posterior",
    "check_latent_only",
    "condition_joint",
    "conditioning_batch_shape",
    "conditioning_noise",
    "correction_batch_shape",
    "eval_mode",
    "fit_frozen_transforms",
    "invalidate_after_load",
    "kernel_and_likelihood_or_defaults",
    "parameter_snapshot",
    "parameters_unchanged",
    "shallow_view",
    "transaction",
    "transform_new_data",
]
