r"""The jobs of :class:`~streamgp.models.WiskiGP`, one mixin each (private).

``models/wiski.py`` holds the model itself: its options, its state (the statistics, the
grid, the cached posterior and the conditioning log, with the lists that make an update
transactional and the caches droppable) and the posterior's life cycle (built from the
statistics, updated by rows, folded, compressed to LOVE). What it does around that lives
here, one module per job, each a mixin of methods that ``WiskiGP`` inherits unchanged:

- :mod:`.outputs` (:class:`OutputsMixin`): the layout of ``k`` outputs and the constant
  prior mean;
- :mod:`.statistics` (:class:`StatisticsMixin`): what the model keeps of its observations,
  the switch from data space to grid space, and the fit objective;
- :mod:`.state` (:class:`CheckpointStateMixin`): ``state_dict`` entries and checkpoints;
- :mod:`.checks` (:class:`ValueChecksMixin`): the noise level and the value checks read
  once per public call;
- :mod:`.botorch` (:class:`BoTorchDataMixin`): the training data as BoTorch's
  ``SingleTaskGP`` shows them (``train_inputs``, ``_transform_tensor_args``, ...);
- :mod:`.prediction` (:class:`PredictionMixin`): ``forward`` (eager or a replayed CUDA
  graph) and the exact prior variance;
- :mod:`.updates` (:class:`UpdatesMixin`): ``observe`` (with deferred folds),
  ``condition_on_observations``, ``subset_output`` and views;
- :mod:`.rebuild` (:class:`RebuildMixin`): exact rebuilds of the statistics from the kept
  data: re-grids, ``refine_grid`` and ``restandardize``.

The mixins keep no state and define no name twice, and ``WiskiGP`` lists them before its
other bases, so every attribute resolves to the same code as when it was one class. They
are not a public API: import the model from :mod:`streamgp.models`.
"""

from streamgp.models._wiski.botorch import BoTorchDataMixin
from streamgp.models._wiski.checks import ValueChecksMixin
from streamgp.models._wiski.outputs import OutputsMixin
from streamgp.models._wiski.prediction import PredictionMixin
from streamgp.models._wiski.rebuild import RebuildMixin
from streamgp.models._wiski.state import CheckpointStateMixin
from streamgp.models._wiski.statistics import StatisticsMixin
from streamgp.models._wiski.updates import UpdatesMixin

__all__ = [
    "BoTorchDataMixin",
    "CheckpointStateMixin",
    "OutputsMixin",
    "PredictionMixin",
    "RebuildMixin",
    "StatisticsMixin",
    "UpdatesMixin",
    "ValueChecksMixin",
]
