r"""The online regression and classification protocol of the WISKI paper (section 5).

Stanton, Maddox, Delbridge & Wilson, "Kernel Interpolation for Scalable Online
Gaussian Processes" (AISTATS 2021), sections 5.1-5.2 and appendix C.1:

1. **Pretraining**: each model fits its hyperparameters on the first 5% of the
   (shuffled, scaled) training set with ``pretrain_steps`` full-batch Adam steps at
   ``pretrain_lr`` (the paper's ``T_batch`` epochs at ``eta_batch``).
2. **Streaming**: the remaining 95% arrive ``batch_size`` observations at a time (one
   by default); after each arrival the model absorbs it and takes **one** Adam step
   (learning rate ``lr``, the paper's ``eta_online``) on its objective.
3. **Evaluation**: every ``eval_every`` steps (and at the end) the model predicts the
   whole test set. Regression reports the RMSE and the mean Gaussian negative log
   predictive density (NLL, observation noise included) **in standardized target
   units** (the split standardizes the targets with training statistics; add
   ``log(split.y_std)`` to an NLL and multiply an RMSE by ``split.y_std`` for original
   units). Classification reports accuracy and the mean negative log probability of
   the true class. The time of each step (absorb + optimizer step) is recorded,
   evaluation excluded.

Models (:data:`STREAM_MODELS`: the registry's entries with a
:class:`~streamgp.models.registry.StreamRecipe`, all run by the one
:class:`~streamgp.loops.stream.learners.Learner`; per-model options in
``StreamConfig.model_options``):

- ``wiski``: :class:`~streamgp.models.WiskiGP`; one Adam step on the exact SKI
  marginal likelihood (:class:`~streamgp.mlls.WoodburyMarginalLogLikelihood`) per
  arrival, constant cost in ``n``. Grid on ``[-1 - margin, 1 + margin]^k``: the split
  scales *training* inputs to ``[-1, 1]`` but test inputs can fall slightly outside,
  so the grid is padded by ``grid_margin`` (default 0.1) and test inputs beyond it are
  clamped onto it (the kernel is nearly flat there at the learned lengthscales). For
  ``d > 3`` (``projection="auto"``) WISKI works on a
  :class:`~streamgp.models.projection.LearnedProjection` ``R^d -> (-1, 1)^2`` updated
  by the same Adam step with old interpolation weights frozen (the paper's eq. 18).
- ``exact``: incremental exact GP (BoTorch ``SingleTaskGP`` on all data so far, one
  Adam step on the exact marginal likelihood per arrival; ``O(n^3)``, so ``exact_max``
  caps its number of observations: its run stops there).
- ``exact-projected``: the same exact GP on WISKI's features: for ``d > 3`` it learns
  the same kind of projection (``projection``, ``projection_dim``, learning-rate
  ratio), as the paper's exact baseline does, but recomputes every point's features
  at each step (a :class:`~streamgp.models.projection.ProjectedKernel`).
- ``osvgp``: :class:`~streamgp.models.OnlineSVGP` (``beta = 1e-3``, one step per batch;
  Bernoulli likelihood for binary classification).
- ``osgpr``: :class:`~streamgp.models.OnlineSGPR` (one step on its online bound).
  With ``inducing="oips"`` both ``osvgp`` and ``osgpr`` take their inducing points from
  an :class:`~streamgp.inducing.OnlineInducingPointSelector` (OIPS, threshold
  ``oips_rho``, at most ``num_inducing`` points) on the model's own kernel, instead of
  their default rules (greedy variance reduction / Bui et al.'s random replacement).
- ``svdgp``: :class:`~streamgp.models.DecoupledSVGP` (SVDGP, Cheng & Boots 2017): a
  covariance basis of at most ``max_covar_basis`` points and a mean basis of at most
  ``max_mean_basis``, both grown from the stream (one new point per one-point batch,
  the paper's Algorithm 1); pretrained with ``pretrain_steps`` minibatch steps, then
  one Adam step per arrival on a minibatch of ``minibatch_size`` points (the new batch
  topped up from the model's bounded reservoir sample of the stream); the KL's mean
  term from ``kl_columns`` sampled columns (default ``minibatch_size``); all four in
  ``model_options["svdgp"]``.
- ``local``: :class:`~streamgp.models.LocalGP` (``model_options["local"]``: ``w_gen``,
  ``n_max``, default 256); its shared
  hyperparameters are those of an exact GP pretrained on the 5% and stay fixed while
  streaming (an optimizer step on the sum of all local marginal likelihoods would cost
  ``O(K n_max^3)`` per arrival).

Classification (Dirichlet GP classification, Milios et al., NeurIPS 2018, WISKI
appendix A.5): :func:`dirichlet_targets` turns labels into one regression target per
class with fixed heteroskedastic noise; ``wiski`` uses one fixed-noise ``WiskiGP`` per
class and ``exact`` one batched fixed-noise ``SingleTaskGP``. Class probabilities are
Monte Carlo averages of ``softmax(f)`` over ``num_samples`` draws of the per-class
latent posteriors (Milios et al. eq. 8); predicted labels are the arg max of those
probabilities.

Example:
    >>> from streamgp.datasets import make_streaming_split, synthetic_regression
    >>> split = make_streaming_split(synthetic_regression(300, seed=1), seed=0)
    >>> config = StreamConfig(pretrain_steps=20)
    >>> loop = StreamingLoop(split, "wiski", config=config, max_stream=20, num_evals=2)
    >>> history = loop.run()  # pretraining (step 0), then 20 one-point steps
    >>> history.dropna(subset=["test_rmse"])["num_observations"].tolist()
    [14, 24, 34]

Modules: :mod:`~streamgp.loops.stream.config` (:class:`StreamConfig`, the per-dataset
presets), :mod:`~streamgp.loops.stream.metrics` (Dirichlet targets, test metrics),
:mod:`~streamgp.loops.stream.learners` (one learner per model; the model registry),
:mod:`~streamgp.loops.stream.loop` (:class:`StreamingLoop`),
:mod:`~streamgp.loops.stream.runner` (:func:`run_stream_experiment` over models, trials
and executors) and :mod:`~streamgp.loops.stream.results` (tables of the curves).

References:

.. [Stanton2021] S. Stanton, W. J. Maddox, I. Delbridge, A. G. Wilson. Kernel
    Interpolation for Scalable Online Gaussian Processes. International Conference on
    Artificial Intelligence and Statistics, 2021.
.. [Milios2018] D. Milios, R. Camoriano, P. Michiardi, L. Rosasco, M. Filippone.
    Dirichlet-based Gaussian Processes for Large-scale Calibrated Classification.
    Advances in Neural Information Processing Systems 31, 2018.
"""

from streamgp.loops.stream.config import DATASET_STREAM_SETTINGS, StreamConfig
from streamgp.loops.stream.learners import (
    CLASSIFICATION_MODELS,
    PREDICT_CHUNK,
    STREAM_MODELS,
    Learner,
)
from streamgp.loops.stream.loop import StreamingLoop
from streamgp.loops.stream.metrics import (
    classification_metrics,
    dirichlet_probabilities,
    dirichlet_targets,
    regression_metrics,
)
from streamgp.loops.stream.results import evaluations_nearest, merge_runs, summarize_stream
from streamgp.loops.stream.runner import StreamSplits, run_stream_experiment

__all__ = [
    "CLASSIFICATION_MODELS",
    "DATASET_STREAM_SETTINGS",
    "PREDICT_CHUNK",
    "STREAM_MODELS",
    "Learner",
    "StreamConfig",
    "StreamSplits",
    "StreamingLoop",
    "classification_metrics",
    "dirichlet_probabilities",
    "dirichlet_targets",
    "evaluations_nearest",
    "merge_runs",
    "regression_metrics",
    "run_stream_experiment",
    "summarize_stream",
]
