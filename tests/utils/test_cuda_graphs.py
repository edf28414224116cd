r"""CUDA-graph replay of WISKI's posterior (:class:`streamgp.settings.cuda_graphs`).

On CUDA (skipped without it): under the setting, a grid-space ``WiskiGP``'s posterior
means, variances, joint covariances and their gradients in ``X`` equal the eager ones
(float64, ``1e-10``), a graph was captured (the path did not silently fall back), a
later replay leaves an earlier result intact, and new caches (``observe``,
conditioning) capture new graphs that again agree. On the CPU: the captured function
reads nothing on the host (so it can be captured) and assembles the same posterior as
``forward``; the setting changes nothing there; the cache copies as empty.
"""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from botorch.acquisition import qUpperConfidenceBound
from botorch.sampling import SobolQMCNormalSampler
from oracles import rel_err
from test_device_sync import no_host_reads

from streamgp import WiskiGP
from streamgp.linalg.woodbury import GridPosterior
from streamgp.settings import cuda_graphs
from streamgp.utils.cuda_graphs import GraphCache

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
TOL = 1e-10


def grid_model(
    device: str = "cpu", n: int = 1500, outputs: int = 1, shared: bool = True
) -> WiskiGP:
    generator = torch.Generator().manual_seed(0)
    X = torch.rand(n, 3, generator=generator, dtype=torch.float64)
    Y = torch.sin(6 * X).sum(-1, keepdim=True) + 0.1 * torch.randn(
        n, outputs, generator=generator, dtype=torch.float64
    )
    bounds = torch.tensor([[0.0] * 3, [1.0] * 3], dtype=torch.float64, device=device)
    model = WiskiGP(
        X.to(device),
        Y.to(device),
        grid_size=10,
        grid_bounds=bounds,
        shared_hyperparameters=shared,
    )
    model.eval()
    assert isinstance(model.exact_posterior(), GridPosterior)
    return model


def points(shape: tuple[int, ...], device: str, seed: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(*shape, 3, generator=generator, dtype=torch.float64).to(device)


def moments(model: WiskiGP, X: torch.Tensor) -> list[torch.Tensor]:
    posterior = model.posterior(X)
    return [posterior.mean, posterior.variance, posterior.mvn.covariance_matrix]


def assert_agree(graphed: list[torch.Tensor], eager: list[torch.Tensor]) -> None:
    for a, b in zip(graphed, eager, strict=True):
        assert a.shape == b.shape
        assert rel_err(a, b) < TOL


# ---------------------------------------------------------------------- CPU
@pytest.mark.parametrize(
    ("outputs", "shared"),
    [(1, True), (2, True), (2, False)],
    ids=["one output", "two outputs", "two outputs, own hyperparameters"],
)
def test_the_captured_function_reads_nothing_on_the_host_and_gives_forwards_posterior(
    outputs, shared
):
    model = grid_model(n=1500, outputs=outputs, shared=shared)
    conditioned = model.condition_on_observations(
        points((2,), "cpu", seed=5), torch.zeros(2, outputs, dtype=torch.float64)
    )
    for m in (model, conditioned):
        X = points((4, 3), "cpu")
        if not shared:  # (forward takes the outputs' member dimension)
            X = X.unsqueeze(-3)
        posterior, correction = m.exact_posterior(), m._current_correction()
        with torch.no_grad(), no_host_reads():
            factors = m._grid_factors(X, posterior, correction)
        assert len(factors) == (4 if correction.rank else 3)
        with torch.no_grad():
            graphed = m._graphed_forward(X, posterior, correction)  # eager on the CPU
            eager = m(X)
        assert rel_err(graphed.mean, eager.mean) < TOL
        assert rel_err(graphed.covariance_matrix, eager.covariance_matrix) < TOL
        assert rel_err(graphed.variance, eager.variance) < TOL


#: Backward nodes that read the host (``prod``'s counts its zeros with ``.item()``): a
#: synchronisation on a GPU that would also break a captured gradient.
HOST_READING_BACKWARDS = {"ProdBackward0", "ProdBackward1"}


def test_the_captured_functions_gradient_reads_nothing_on_the_host():
    model = grid_model()
    X = points((4, 3), "cpu").requires_grad_(True)
    factors = model._grid_factors(X, model.exact_posterior(), model._current_correction())
    seen, stack = set(), [f.grad_fn for f in factors]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        stack += [following for following, _ in node.next_functions]
    names = {type(node).__name__ for node in seen}
    assert "IndexBackward0" in names  # (the walk reached the interpolation weights)
    assert not names & HOST_READING_BACKWARDS
    with no_host_reads():
        (grad,) = torch.autograd.grad(sum(f.sum() for f in factors), X)
    assert torch.isfinite(grad).all()


def test_the_setting_changes_nothing_on_the_cpu():
    model = grid_model()
    X = points((5,), "cpu")
    eager = moments(model, X)
    with cuda_graphs():
        assert cuda_graphs.on()
        graphed = moments(model, X)
    assert not cuda_graphs.on()
    for a, b in zip(graphed, eager, strict=True):
        assert torch.equal(a, b)


def test_a_graph_cache_copies_and_pickles_empty():
    cache = GraphCache(max_graphs=3)
    cache._graphs["key"] = None  # (a failed capture's entry)
    assert len(copy.deepcopy(cache)._graphs) == 0
    restored = pickle.loads(pickle.dumps(cache))
    assert len(restored._graphs) == 0 and restored.max_graphs == 3


# ---------------------------------------------------------------------- CUDA
@CUDA
def test_cuda_graphed_posteriors_and_gradients_equal_the_eager_ones():
    model = grid_model("cuda")
    for shape in [(16,), (5, 3)]:
        X = points(shape, "cuda")
        eager = moments(model, X)
        with cuda_graphs():
            first = moments(model, X)  # captures
            second = moments(model, X)  # replays
        assert_agree(first, eager)
        assert_agree(second, eager)
    assert len(model._graphs) == 2  # one graph per shape: the path did not fall back

    # Differentiable in X (the acquisition optimiser's path), replayed twice.
    X = points((4, 3), "cuda", seed=2)
    Xe = X.clone().requires_grad_(True)
    posterior = model.posterior(Xe)
    (grad_eager,) = torch.autograd.grad(posterior.mean.sum() + posterior.variance.sum(), Xe)
    for _ in range(2):
        Xg = X.clone().requires_grad_(True)
        with cuda_graphs():
            posterior = model.posterior(Xg)
            value = posterior.mean.sum() + posterior.variance.sum()
        (grad,) = torch.autograd.grad(value, Xg)
        assert rel_err(grad, grad_eager) < 1e-8
    assert len(model._graphs) == 3


@CUDA
def test_cuda_a_replay_leaves_earlier_results_intact():
    model = grid_model("cuda")
    X1, X2 = points((8,), "cuda", seed=3), points((8,), "cuda", seed=4)
    with cuda_graphs():
        mean1 = model.posterior(X1).mean
        kept = mean1.clone()
        other = model.posterior(X2).mean
    assert torch.equal(mean1, kept) and not torch.equal(other, kept)


@CUDA
def test_cuda_new_caches_capture_new_graphs_that_agree():
    model = grid_model("cuda")
    X = points((6,), "cuda")
    with cuda_graphs():
        moments(model, X)
    new_X = points((3,), "cuda", seed=7)
    new_Y = torch.sin(6 * new_X).sum(-1, keepdim=True)
    conditioned = model.condition_on_observations(new_X, new_Y)
    model.observe(new_X, new_Y)
    for m in (model, conditioned):
        eager = moments(m, X)
        with cuda_graphs():
            assert_agree(moments(m, X), eager)
        assert len(m._graphs) >= 1


@CUDA
def test_cuda_an_mc_acquisition_value_and_gradient_agree_under_graphs():
    model = grid_model("cuda")
    sampler = SobolQMCNormalSampler(sample_shape=torch.Size([64]), seed=0)
    acqf = qUpperConfidenceBound(model, beta=2.0, sampler=sampler)
    X = points((10, 3), "cuda", seed=8)
    Xe = X.clone().requires_grad_(True)
    value_eager = acqf(Xe)
    (grad_eager,) = torch.autograd.grad(value_eager.sum(), Xe)
    with cuda_graphs():
        for _ in range(2):
            Xg = X.clone().requires_grad_(True)
            value = acqf(Xg)
            (grad,) = torch.autograd.grad(value.sum(), Xg)
            assert rel_err(value, value_eager) < 1e-8
            assert rel_err(grad, grad_eager) < 1e-8
    fantasy = model.fantasize(X[0], SobolQMCNormalSampler(sample_shape=torch.Size([2])))
    assert len(copy.deepcopy(model)._graphs) == 0 and fantasy is not None
