r"""What every streamgp model shares with BoTorch's own entry points.

BoTorch client code (its tutorials, Ax) fits a model with
``fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model))`` or a
``SumMarginalLogLikelihood`` over a ``ModelListGP``, and warm-starts a model rebuilt on
all data with ``model.load_state_dict(old_model.state_dict())``. Streaming models keep
summaries of their data (sufficient statistics, pseudo-observations, a variational
posterior), not ``train_inputs``, so both entry points need the model's help:

- :meth:`StreamingModelMixin.compute_custom_loss` is the hook BoTorch's loss closures
  call (``botorch.optim.closures.model_closures``) for any marginal likelihood whose
  ``model`` has it. It returns the model's own objective (the exact SKI likelihood, the
  online collapsed bound, the streaming ELBO, ...) from :meth:`fit_objective`, plus the
  log densities of the priors registered on the marginal likelihood, divided by the
  number of observations as gpytorch's ``ExactMarginalLogLikelihood`` normalises.
- :meth:`StreamingModelMixin.load_state_dict` keeps the receiving model's data by
  default: only hyperparameters are loaded (BoTorch's ``keep_transforms=True``
  semantics, extended to the data summaries). ``keep_transforms=False`` restores
  everything ``state_dict()`` saved, to resume a stream.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from botorch.models.model import Model
from botorch.models.transforms.input import InputTransform
from botorch.models.transforms.outcome import OutcomeTransform
from botorch.utils.datasets import SupervisedDataset
from gpytorch.distributions import MultivariateNormal
from gpytorch.kernels import Kernel
from gpytorch.means import Mean
from torch import Tensor

from streamgp.mlls.objective import per_datum_objective
from streamgp.models.utils.posterior import PosteriorMixin
from streamgp.models.utils.transaction import restore_snapshot, take_snapshot
from streamgp.utils.checkpoint_files import read_checkpoint_file, write_checkpoint_file

#: Modules whose kind includes what they wrap (see :func:`module_kind`).
_WRAPPED_KINDS = (Kernel, Mean, OutcomeTransform, InputTransform)
#: The modules whose kinds a checkpoint's options record (absent attributes: None).
_MODULE_OPTIONS = (
    "likelihood",
    "covar_module",
    "mean_module",
    "outcome_transform",
    "input_transform",
)


def _state_tensors(checkpoint: dict[str, Any]) -> Iterator[tuple[str, Tensor]]:
    r"""Every tensor of a checkpoint's state and stream, with its path (e.g.
    ``['state_dict']['statistics.y']``), in a fixed order."""

    def visit(value: Any, path: str) -> Iterator[tuple[str, Tensor]]:
        if isinstance(value, Tensor):
            yield path, value
        elif isinstance(value, dict):
            for key, item in value.items():
                yield from visit(item, f"{path}[{key!r}]")
        elif isinstance(value, list | tuple):
            for i, item in enumerate(value):
                yield from visit(item, f"{path}[{i}]")

    yield from visit(checkpoint.get("state_dict"), "['state_dict']")
    yield from visit(checkpoint.get("stream"), "['stream']")


def _check_no_nan_state(checkpoint: dict[str, Any]) -> None:
    r"""Raise naming the first floating tensor of ``checkpoint`` with a NaN entry (a
    corrupted state would predict NaN or fail later; Inf is legitimate, e.g. an
    unbounded constraint's ``upper_bound``)."""
    for path, value in _state_tensors(checkpoint):
        if value.is_floating_point() and bool(torch.isnan(value).any()):
            raise ValueError(f"checkpoint{path} has NaN entries; the model is unchanged.")


def _tensor_shapes(checkpoint: dict[str, Any]) -> dict[str, list[int]]:
    r"""The shape of every tensor of a checkpoint (``meta['shapes']``), by its path."""
    return {path: list(value.shape) for path, value in _state_tensors(checkpoint)}


def _check_shapes(checkpoint: dict[str, Any], shapes: Any) -> None:
    r"""Raise naming the first tensor whose shape is not the one ``meta['shapes']`` records
    (a tensor edited, cut or added after the checkpoint was written)."""
    if not isinstance(shapes, dict):
        raise ValueError(
            f"checkpoint['meta']['shapes'] must be a dict, got {type(shapes).__name__}."
        )
    found = _tensor_shapes(checkpoint)
    for path in [*found, *(path for path in shapes if path not in found)]:
        if found.get(path) != shapes.get(path):
            got, want = found.get(path, "no tensor"), shapes.get(path, "no tensor")
            raise ValueError(
                f"checkpoint{path} has shape {got}, its checkpoint['meta']['shapes'] records "
                f"{want}: the checkpoint was edited or damaged; the model is unchanged."
            )


def module_kind(module: Any) -> str | None:
    r"""A module's kind for a checkpoint's options: its class and those of the kernels,
    means or transforms it wraps (not its priors or constraints), or None for no module.

    Two kernels with the same parameter names (an RBF and a Matern kernel) load each
    other's ``state_dict`` without complaint; their kinds differ.

    Example:
        >>> from gpytorch.kernels import RBFKernel, ScaleKernel
        >>> module_kind(ScaleKernel(RBFKernel()))
        'ScaleKernel(RBFKernel)'
    """
    if module is None:
        return None
    wrapped = [
        module_kind(child) for child in module.children() if isinstance(child, _WRAPPED_KINDS)
    ]
    kind = type(module).__name__
    return f"{kind}({', '.join(wrapped)})" if wrapped else kind


def checkpoint_checksum(checkpoint: dict[str, Any]) -> str:
    r"""SHA-256 of a checkpoint's class, state and stream (keys, types, dtypes, shapes
    and bytes of every tensor, and every number and string): a corrupted file that
    still loads is refused by :meth:`CheckpointMixin.restore` instead of restored.

    Example:
        >>> state = {"model": "M", "state_dict": {"w": torch.ones(2)}, "stream": {}}
        >>> checkpoint_checksum(state) == checkpoint_checksum(dict(state))
        True
    """
    digest = hashlib.sha256()

    def visit(value: Any) -> None:
        digest.update(type(value).__name__.encode())
        if isinstance(value, Tensor) and value.is_sparse:  # large grids' statistics
            value = value.detach().coalesce()
            digest.update(f"sparse{tuple(value.shape)}".encode())
            visit(value.indices())
            visit(value.values())
        elif isinstance(value, Tensor):
            value = value.detach().cpu().contiguous()
            digest.update(f"{value.dtype}{tuple(value.shape)}".encode())
            digest.update(value.reshape(-1).view(torch.uint8).numpy().tobytes())
        elif isinstance(value, dict):
            for key, item in value.items():
                digest.update(repr(key).encode())
                visit(item)
        elif isinstance(value, list | tuple):
            digest.update(str(len(value)).encode())
            for item in value:
                visit(item)
        else:  # numbers, strings, None
            digest.update(repr(value).encode())

    for key in ("model", "state_dict", "stream"):
        visit(checkpoint.get(key))
    if "meta" in checkpoint:  # checkpoints written before it existed still verify
        visit(checkpoint["meta"])
    return digest.hexdigest()


def construct_inputs_with_options(
    cls: type, training_data: SupervisedDataset, **options: Any
) -> dict[str, Any]:
    r"""BoTorch's ``construct_inputs`` plus constructor options (Ax's ``model_options``).

    BoTorch's base version takes the dataset only, so Ax's
    ``ModelConfig(model_options={"grid_size": 16})`` would fail; here the options are
    passed through to the constructor, which names any it does not take.
    """
    return {**Model.construct_inputs.__func__(cls, training_data), **options}


def _versions() -> dict[str, str]:
    import botorch
    import gpytorch

    from streamgp import __version__

    # Plain strings (torch.__version__ is a str subclass a weights_only load refuses).
    return {
        "streamgp": str(__version__),
        "torch": str(torch.__version__),
        "botorch": str(botorch.__version__),
        "gpytorch": str(gpytorch.__version__),
    }


class CheckpointMixin:
    r"""``checkpoint()`` / ``restore()``: a model's whole stream as a dict of tensors.

    A model using it implements ``load_state_dict(state, keep_transforms=False)`` (load
    everything ``state_dict()`` saved) and, for state held outside ``state_dict()``,
    :meth:`_stream_state` and :meth:`_set_stream_state`. It describes the options that
    shape its state in :meth:`_checkpoint_options`; those it takes over from a checkpoint
    on restore (a grid model's grid) are listed in :attr:`ADOPTED_OPTIONS`, the others must
    match.
    """

    #: Options in :meth:`_checkpoint_options` that ``restore`` takes from the checkpoint
    #: instead of requiring them equal.
    ADOPTED_OPTIONS: frozenset[str] = frozenset()

    def checkpoint(self) -> dict[str, Any]:
        r"""Everything needed to resume this model's stream exactly.

        ``state_dict()`` (hyperparameters, transforms, the data summaries) plus the
        streaming state held outside it (e.g. a frozen old posterior, a replay set, the
        last batch, random generators, the optimizer's moments). Tensors, numbers and
        containers of them only, so ``torch.save`` writes it and
        ``torch.load(path, weights_only=True)`` reads it. A model restored from it
        predicts bit for bit as this one, and continues the stream as it would. It is a
        snapshot: later updates of this model do not change it.

        Example:
            >>> import io
            >>> from streamgp.models import WiskiGP
            >>> X0 = torch.rand(20, 2, dtype=torch.float64)
            >>> Y0 = torch.sin(6 * X0).sum(-1, keepdim=True)
            >>> model = WiskiGP(X0, Y0, grid_size=16)
            >>> X1 = torch.rand(5, 2, dtype=torch.float64)
            >>> model = model.observe(X1, torch.sin(6 * X1).sum(-1, keepdim=True))
            >>> file = io.BytesIO()  # or a path
            >>> torch.save(model.checkpoint(), file)
            >>> _ = file.seek(0)
            >>> resumed = WiskiGP(X0, Y0, grid_size=16).restore(
            ...     torch.load(file, weights_only=True))
            >>> X_test = torch.rand(4, 2, dtype=torch.float64)
            >>> torch.equal(resumed.posterior(X_test).mean, model.posterior(X_test).mean)
            True
        """
        checkpoint = self._snapshot()
        checkpoint["meta"] = {
            "dtype": str(self._state_dtype()),
            "versions": _versions(),
            "options": self._checkpoint_options(),
            "shapes": _tensor_shapes(checkpoint),
        }
        checkpoint["checksum"] = checkpoint_checksum(checkpoint)
        return checkpoint

    def save_checkpoint(self, path: str | Path) -> Path:
        r"""Write :meth:`checkpoint` to ``path`` atomically (a temporary file, then a
        rename: a crash never leaves a truncated file); returns the path.

        Example:
            >>> import tempfile
            >>> from streamgp.models import WiskiGP
            >>> X = torch.rand(20, 2, dtype=torch.float64)
            >>> model = WiskiGP(X, torch.sin(6 * X).sum(-1, keepdim=True), grid_size=16)
            >>> path = model.save_checkpoint(f"{tempfile.mkdtemp()}/wiski.pt")
            >>> resumed = WiskiGP(X[:5], X[:5, :1], grid_size=16).load_checkpoint(path)
            >>> resumed.num_train
            20
        """
        return write_checkpoint_file(self.checkpoint(), path)

    def load_checkpoint(self, path: str | Path) -> CheckpointMixin:
        r""":meth:`restore` the checkpoint file ``path`` (read with ``weights_only=True``).

        Raises:
            FileNotFoundError: If there is no such file.
            ValueError: Naming the path, if the file is truncated, corrupted or holds
                anything but tensors and plain types; or as :meth:`restore` does. The
                model is then unchanged.
        """
        checkpoint = read_checkpoint_file(path, f"a {type(self).__name__} checkpoint")
        try:
            return self.restore(checkpoint)
        except ValueError as error:
            raise ValueError(f"checkpoint file {str(path)!r}: {error}") from error

    def _state_dtype(self) -> torch.dtype:
        r"""The floating dtype of the model's state (its first floating tensor)."""
        for tensor in self.state_dict().values():
            if isinstance(tensor, Tensor) and tensor.is_floating_point():
                return tensor.dtype
        return torch.get_default_dtype()

    def _checkpoint_options(self) -> dict[str, Any]:
        r"""The constructor options that shape the state (plain values only).

        The number of outputs and the kinds of the model's modules (:func:`module_kind`):
        another likelihood, kernel, prior mean or transform has other state, or the
        same parameter names with another meaning. A model adds its own (sizes, grids),
        listing in :attr:`ADOPTED_OPTIONS` those it takes over from a checkpoint.
        """
        num_outputs = getattr(self, "num_outputs", None)
        options: dict[str, Any] = {} if num_outputs is None else {"num_outputs": int(num_outputs)}
        for name in _MODULE_OPTIONS:
            options[name] = module_kind(getattr(self, name, None))
        return options

    def _check_meta(self, meta: Any) -> None:
        r"""Refuse a checkpoint written for another dtype or other state-shaping options.

        The model's own options are compared before the kinds of its modules, which
        follow from them (fixed noise has its own likelihood).
        """
        if not isinstance(meta, dict):
            raise ValueError(f"checkpoint['meta'] must be a dict, got {type(meta).__name__}.")
        dtype = str(self._state_dtype())
        if "dtype" in meta and meta["dtype"] != dtype:
            raise ValueError(
                f"checkpoint['meta']['dtype'] is {meta['dtype']}, this model's is {dtype}: "
                "build the receiving model in the checkpoint's dtype; the model is unchanged."
            )
        own = self._checkpoint_options()
        saved = meta.get("options") or {}
        for name in sorted(saved, key=lambda name: name in _MODULE_OPTIONS):
            value = saved[name]
            if name in self.ADOPTED_OPTIONS or name not in own or own[name] == value:
                continue
            raise ValueError(
                f"checkpoint['meta']['options'][{name!r}] is {value!r}, this model's is "
                f"{own[name]!r}: build the receiving model with {name}={value!r}; the model "
                "is unchanged."
            )

    def _snapshot(self) -> dict[str, Any]:
        r"""The checkpoint without its checksum (also ``restore``'s backup)."""
        # Copies: torch's state_dict() and an optimizer's state share storage with the
        # live tensors, which the next update changes in place.
        return {
            "model": type(self).__name__,
            "state_dict": {k: v.detach().clone() for k, v in self.state_dict().items()},
            "stream": copy.deepcopy(self._stream_state()),
        }

    def restore(self, checkpoint: dict[str, Any]) -> CheckpointMixin:
        r"""Resume the stream saved by :meth:`checkpoint` (in place; returns the model).

        The receiving model must be of the checkpoint's class (``checkpoint["model"]``,
        checked first) and built with the same options (kernel, inducing-set size,
        likelihood); whatever data it held are replaced. Atomic: a
        checkpoint that does not fit raises and leaves the model as it was, bit for bit
        (torch's ``load_state_dict`` alone would have loaded part of it before raising),
        and so does one whose ``checksum`` does not match its contents (a corrupted
        file that still loads).
        """
        keys = {"model", "state_dict", "stream", "checksum", "meta"}
        if not isinstance(checkpoint, dict) or not (
            {"state_dict", "stream"} <= set(checkpoint) <= keys
        ):
            keys = sorted(checkpoint) if isinstance(checkpoint, dict) else type(checkpoint)
            raise ValueError(
                "checkpoint must be a dict from model.checkpoint() with keys 'model', "
                f"'state_dict' and 'stream'; got {keys}."
            )
        saved_class = checkpoint.get("model", type(self).__name__)  # older: no class
        if saved_class != type(self).__name__:
            raise ValueError(
                f"checkpoint['model'] is {saved_class}: a {saved_class} checkpoint cannot be "
                f"restored into a {type(self).__name__}; the model is unchanged."
            )
        _check_no_nan_state(checkpoint)
        if "checksum" in checkpoint and checkpoint["checksum"] != checkpoint_checksum(checkpoint):
            raise ValueError(
                "checkpoint['checksum'] does not match its contents: the checkpoint is "
                "corrupted (or was edited); the model is unchanged."
            )
        if "meta" in checkpoint:
            self._check_meta(checkpoint["meta"])
            if "shapes" in checkpoint["meta"]:  # (checkpoints written before it have none)
                _check_shapes(checkpoint, checkpoint["meta"]["shapes"])
        # What the model's updates may change (its state and caches, by reference) is
        # put back after the backup: the model then predicts bit for bit as before.
        kept = take_snapshot(self) if hasattr(self, "mutable_state") else None
        backup = self._snapshot()
        try:
            self._load_checkpoint(checkpoint)
        except BaseException:
            self._load_checkpoint(backup)
            if kept is not None:
                restore_snapshot(self, kept)
            raise
        return self

    def _load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.load_state_dict(checkpoint["state_dict"], keep_transforms=False)
        # A copy: the model's later updates (an optimizer's in-place steps) must not
        # change the checkpoint, which may be restored again.
        self._set_stream_state(copy.deepcopy(checkpoint["stream"]))

    def _stream_state(self) -> dict[str, Any]:
        r"""Streaming state outside ``state_dict()`` (tensors and numbers only)."""
        return {}

    def _set_stream_state(self, state: dict[str, Any]) -> None:
        r"""Inverse of :meth:`_stream_state`."""


class TrainingModeOutput(MultivariateNormal):
    r"""The output of a streaming model's ``model(X)`` in training mode: every use raises.

    A ``MultivariateNormal`` only so that gpytorch's checks let it through to the first
    use of its mean or covariance, which raises a ``RuntimeError`` saying how to fit (see
    :meth:`StreamingModelMixin._training_mode_output`).
    """

    _allowed = frozenset({"_message", "__class__", "__dict__", "__repr__"})

    def __init__(self, message: str) -> None:  # (no distribution is built)
        object.__setattr__(self, "_message", message)

    def __getattribute__(self, name: str) -> Any:
        if name in TrainingModeOutput._allowed:
            return object.__getattribute__(self, name)
        raise RuntimeError(object.__getattribute__(self, "_message"))

    def __repr__(self) -> str:
        return "TrainingModeOutput(<refuses every use: call model.eval() first>)"


class StreamingModelMixin(CheckpointMixin, PosteriorMixin):
    r"""Fitting, warm-start and posterior plumbing shared by streamgp's models.

    A model lists it before its BoTorch base classes and gpytorch's ``GP`` (which
    gpytorch's marginal likelihoods require of their ``model``), sets
    :attr:`data_state_prefixes` (the ``state_dict`` keys that hold data rather than
    hyperparameters), implements :meth:`fit_objective` and the hooks of
    :class:`~streamgp.models.utils.posterior.PosteriorMixin` (``posterior``).
    """

    #: ``state_dict`` key prefixes that belong to the data (summaries of the
    #: observations, frozen transforms), not to the hyperparameters.
    data_state_prefixes: tuple[str, ...] = ("input_transform.", "outcome_transform.")

    construct_inputs = classmethod(construct_inputs_with_options)

    def fit_objective(self) -> tuple[Tensor, Tensor]:
        r"""The model's own objective of all its data and the number of observations.

        Returns:
            ``(value, n)``: the log marginal likelihood (or the bound the model
            maximises), summed over observations and differentiable in the parameters
            BoTorch should fit, and ``n`` (a tensor) to normalise by.
        """
        raise NotImplementedError

    def compute_custom_loss(self, mll: Any, **kwargs: Any) -> Tensor:
        r"""The loss BoTorch's ``fit_gpytorch_mll`` minimises for this model, whatever ``mll``.

        BoTorch's loss closures call this for any marginal likelihood wrapping the model,
        so ``ExactMarginalLogLikelihood(model.likelihood, model)`` and a
        ``SumMarginalLogLikelihood`` over a ``ModelListGP`` fit :meth:`fit_objective`
        (a generic gpytorch likelihood would call ``model(*model.train_inputs)``).
        """
        value, n = self.fit_objective()
        return -per_datum_objective(mll, value, n)

    #: The model's latent posterior at transformed inputs (``X -> MultivariateNormal``),
    #: where it has one (WISKI, SoftKI, O-SGPR define the method); None for a model that
    #: predicts through :meth:`posterior` only (O-SVGP, SVDGP, local GPs).
    _latent_forward = None

    def forward(self, X: Tensor) -> Any:
        r"""``model(X)``: the latent posterior in eval mode; refused otherwise.

        In training mode the output refuses every use (:meth:`_training_mode_output`);
        a model without a latent posterior raises a ``NotImplementedError`` naming
        :meth:`posterior` (gpytorch's ``Module.forward`` raised one without a message).
        """
        if self._latent_forward is None:
            raise NotImplementedError(
                f"{type(self).__name__}(X): this model predicts through model.posterior(X) "
                "only; it is fitted with botorch.fit.fit_gpytorch_mll("
                "ExactMarginalLogLikelihood(model.likelihood, model)) (or "
                "model.compute_custom_loss(mll) in your own loop)."
            )
        if self.training:
            return self._training_mode_output()
        return self._latent_forward(X)

    def _training_mode_output(self) -> TrainingModeOutput:
        r"""What :meth:`forward` returns in training mode.

        Such a model has no prior to return on its training inputs (an ``ExactGP``'s
        training-mode output): gpytorch's hand-written loop
        ``-ExactMarginalLogLikelihood(...)(model(train_x), train_y)`` would score the
        posterior there, a different objective with no gradient in the kernel, silently.
        So the output refuses every use, naming the ways to fit; a marginal likelihood
        that ignores it (:class:`~streamgp.mlls.WoodburyMarginalLogLikelihood`) works as
        before. ``fit_gpytorch_mll`` never calls ``forward`` (its closures use
        :meth:`compute_custom_loss`), nor does ``posterior`` (which switches to eval
        mode).
        """
        name = type(self).__name__
        return TrainingModeOutput(
            f"{name}(X) was called in training mode. Its forward is the posterior given "
            "its data, so gpytorch's -mll(model(train_x), train_y) would score that, not the "
            "model's marginal likelihood. Fit with botorch.fit.fit_gpytorch_mll("
            "ExactMarginalLogLikelihood(model.likelihood, model)) (a "
            "SumMarginalLogLikelihood for a ModelListGP), or in your own loop minimise "
            "model.compute_custom_loss(mll); call model.eval() before using model(X)."
        )

    def is_data_key(self, key: str) -> bool:
        r"""Whether ``state_dict()[key]`` holds data rather than a hyperparameter."""
        return key.startswith(self.data_state_prefixes)

    def load_state_dict(
        self,
        state_dict: dict[str, Any],
        strict: bool = True,
        keep_transforms: bool = True,
        **kwargs: Any,
    ):
        r"""Load hyperparameters (a warm start), or a whole stream (a checkpoint).

        With the default ``keep_transforms=True`` this model keeps its data and
        transforms: only the hyperparameters are taken from ``state_dict``, whatever data
        the model that saved it had seen. This is the warm start of BoTorch's tutorials
        (rebuild on all data, load the previous model's state). ``keep_transforms=False``
        restores everything ``state_dict()`` saved, to resume a stream; the state holds
        tensors only, so ``torch.load(path, weights_only=True)`` reads it.

        Args:
            state_dict: From ``state_dict()`` of a model of the same class.
            strict: As ``torch.nn.Module.load_state_dict``.
            keep_transforms: Keep this model's data and transforms (default), or
                restore those in ``state_dict``.
        """
        if not keep_transforms:
            self._prepare_state_load(state_dict)
            return torch.nn.Module.load_state_dict(self, state_dict, strict=strict)
        own = {k: v for k, v in self.state_dict().items() if self.is_data_key(k)}
        state_dict = {k: v for k, v in state_dict.items() if not self.is_data_key(k)} | own
        result = torch.nn.Module.load_state_dict(self, state_dict, strict=strict)
        self._after_warm_start()
        return result

    def _prepare_state_load(self, state_dict: dict[str, Any]) -> None:
        r"""Resize data buffers to ``state_dict``'s before a checkpoint restore."""

    def _after_warm_start(self) -> None:
        r"""Bring derived state up to the hyperparameters a warm start loaded."""
