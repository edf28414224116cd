r"""The streaming protocol for one model on one split: :class:`StreamingLoop`."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import pandas as pd
import torch
from torch import Tensor

from streamgp.datasets.preprocessing import StreamingSplit
from streamgp.loops.base import Loop, Stopwatch
from streamgp.loops.stream.config import StreamConfig
from streamgp.loops.stream.learners import Learner
from streamgp.loops.stream.metrics import (
    classification_metrics,
    dirichlet_probabilities,
    dirichlet_targets,
    regression_metrics,
)
from streamgp.models.registry import get_model_spec, registered_models
from streamgp.utils.validation import check_count


class StreamingLoop(Loop):
    r"""The WISKI paper's online protocol for one model on one split.

    Step 0 pretrains on ``split.pretrain_X`` (timed as ``fit``); each later step streams
    the next ``batch_size`` training rows (timed as ``update``). Records: ``step``,
    ``num_observations``, the test metrics at evaluation steps (NaN elsewhere),
    ``fit_time``, ``update_time``, ``step_time``, ``cumulative_time``.

    Args:
        split: A :class:`~streamgp.datasets.StreamingSplit`.
        model: A registered model the protocol runs (``registered_models(loop="stream")``;
            classification: those with the ``"classification"`` capability).
        batch_size: Observations per step.
        eval_every: Steps between test evaluations (default: about ``num_evals``
            evaluations over the stream).
        num_evals: Evaluations when ``eval_every`` is not given.
        max_stream: Stream at most this many observations after pretraining.
        config: :class:`StreamConfig`.
        seed: As :class:`~streamgp.loops.base.Loop`.
        device: As :class:`~streamgp.loops.base.Loop`.
        dtype: As :class:`~streamgp.loops.base.Loop`.
    """

    PHASES = ("fit", "update")

    def __init__(
        self,
        split: StreamingSplit,
        model: str = "wiski",
        *,
        batch_size: int = 1,
        eval_every: int | None = None,
        num_evals: int = 50,
        max_stream: int | None = None,
        config: StreamConfig | None = None,
        seed: int = 0,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float64,
    ) -> None:
        if not isinstance(split, StreamingSplit):
            raise TypeError(f"split must be a StreamingSplit, got {type(split).__name__}.")
        stream_models = registered_models(loop="stream")  # what is registered now
        if model not in stream_models:
            raise ValueError(f"model must be one of {list(stream_models)}, got {model!r}.")
        self.classification = split.task == "classification"
        classifiers = registered_models("classification", loop="stream")
        if self.classification and model not in classifiers:
            raise ValueError(
                f"model {model!r} has no classification variant; choose from {list(classifiers)}."
            )
        check_count(batch_size, "batch_size", minimum=1)
        check_count(num_evals, "num_evals", minimum=1)
        check_count(eval_every, "eval_every", minimum=1, allow_none=True)
        check_count(max_stream, "max_stream", minimum=1, allow_none=True)
        config = StreamConfig() if config is None else config
        if not isinstance(config, StreamConfig):
            raise TypeError(f"config must be a StreamConfig, got {type(config).__name__}.")
        super().__init__(seed=seed, device=device, dtype=dtype)
        self.split = split
        self.model_name = model
        self.batch_size = batch_size
        self.stream_config = config
        stream = len(split.online_X) if max_stream is None else min(max_stream, len(split.online_X))
        if get_model_spec(model).stream.capped and config.exact_max is not None:
            stream = max(0, min(stream, config.exact_max - split.num_pretrain))
        self.stream_length = stream
        self.eval_every = eval_every or max(1, self.num_steps // num_evals)
        self.learner: Learner | None = None

    @property
    def num_steps(self) -> int:
        r"""Steps after pretraining (``ceil(stream_length / batch_size)``)."""
        return -(-self.stream_length // self.batch_size)

    def config(self) -> dict[str, Any]:
        return {
            **super().config(),
            "dataset": self.split.name,
            "split_seed": self.split.seed,
            "model": self.model_name,
            "batch_size": self.batch_size,
            "stream_length": self.stream_length,
            "stream_config": asdict(self.stream_config),
        }

    def describe(self) -> str:
        return f"{self.split.name}/{self.model_name}"

    def progress_fields(self, record: dict[str, Any]) -> dict[str, Any]:
        return {"n": record["num_observations"]}

    # ------------------------------------------------------------------ data
    def _targets(self, labels_or_Y: Tensor) -> tuple[Tensor, Tensor | None]:
        Y = labels_or_Y.to(**self.tkwargs)
        if not self.classification:
            return Y, None
        if self.model_name == "osvgp":
            if self.split.num_classes != 2:
                raise ValueError("osvgp classification (Bernoulli) needs binary labels.")
            return Y.unsqueeze(-1), None
        return dirichlet_targets(Y, self.split.num_classes, self.stream_config.alpha_epsilon)

    def _evaluate(self) -> dict[str, float]:
        test_X = self.split.test_X.to(**self.tkwargs)
        mean, variance = self.learner.predict(test_X)
        test_Y = self.split.test_Y.to(**self.tkwargs)
        if not self.classification:
            return regression_metrics(mean, variance, test_Y)
        if self.model_name == "osvgp":
            # Probit likelihood: p(y = 1) = Phi(mean / sqrt(1 + variance)), exactly.
            p1 = torch.distributions.Normal(0.0, 1.0).cdf(mean / (1 + variance).sqrt())
            probabilities = torch.cat([1 - p1, p1], -1)
        else:
            probabilities = dirichlet_probabilities(mean, variance, self.stream_config.num_samples)
        return classification_metrics(probabilities, test_Y)

    # ------------------------------------------------------------------ steps
    def _initialize(self, watch: Stopwatch) -> dict[str, Any]:
        X = self.split.pretrain_X.to(**self.tkwargs)
        Y, Yvar = self._targets(self.split.pretrain_Y)
        with watch("fit"):
            self.learner = Learner(
                self.model_name,
                X,
                Y,
                Yvar,
                self.stream_config,
                classification=self.classification,
            )
        return {"num_observations": len(X), **self._evaluate()}

    def _step(self, watch: Stopwatch) -> dict[str, Any]:
        step = len(self.history)  # 1-based streaming step
        start = (step - 1) * self.batch_size
        stop = min(start + self.batch_size, self.stream_length)
        X = self.split.online_X[start:stop].to(**self.tkwargs)
        Y, Yvar = self._targets(self.split.online_Y[start:stop])
        with watch("update"):
            self.learner.step(X, Y, Yvar)
        record: dict[str, Any] = {"num_observations": self.split.num_pretrain + stop}
        if step % self.eval_every == 0 or step == self.num_steps:
            record.update(self._evaluate())
        return record

    def _state(self) -> dict[str, Any]:
        return {"learner": self.learner.state_dict()}

    def _load_state(self, state: dict[str, Any]) -> None:
        # Rebuilt on the first batch without pretraining, then given the saved state; the
        # loop's own random stream is restored apart (a build may draw from it).
        X = self.split.pretrain_X.to(**self.tkwargs)
        Y, Yvar = self._targets(self.split.pretrain_Y)
        with torch.random.fork_rng(devices=self._rng_devices()):
            self.learner = Learner.restored(
                state["learner"],
                X,
                Y,
                Yvar,
                self.stream_config,
                classification=self.classification,
            )

    def run(self, num_steps: int | None = None, **kwargs: Any) -> pd.DataFrame:
        r"""Run the stream (all of it by default); see :meth:`Loop.run`."""
        return super().run(self.num_steps if num_steps is None else num_steps, **kwargs)
