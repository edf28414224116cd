"""transaction: a failed update puts back everything a model declares as mutable."""

import pytest
import torch

from streamgp.models.utils import MutableState, TransactionalMixin, transaction


class _Selector:
    def __init__(self):
        self.points = torch.zeros(2)


class _Model(TransactionalMixin, torch.nn.Module):
    mutable_state = MutableState(
        attributes=("state", "child.count"),
        parameters=("basis",),
        modules=("child",),
        generators=("generator",),
        objects=("selector", "absent"),
    )

    def __init__(self):
        super().__init__()
        self.state = torch.ones(3)
        self.basis = torch.nn.Parameter(torch.arange(3.0))
        self.child = torch.nn.Linear(2, 1)
        self.child.count = 0
        self.generator = torch.Generator().manual_seed(0)
        self.selector = _Selector()
        self.absent = None
        self.rollbacks = 0

    def _after_rollback(self):
        self.rollbacks += 1


def _update(model):
    model.state = torch.zeros(5)  # replaced
    model.child.count = 7
    with torch.no_grad():
        model.basis.mul_(2.0)  # written in place, then replaced (a grown basis)
        model.child.weight.add_(1.0)
    model.basis = torch.nn.Parameter(torch.zeros(4))
    torch.rand(3, generator=model.generator)
    model.selector.points = torch.ones(2)
    raise RuntimeError("diverged")


def test_a_failed_update_is_undone_and_the_error_propagates():
    model = _Model()
    state, basis, count = model.state, model.basis, model.child.count
    weight = model.child.weight.detach().clone()
    draw = torch.rand(3, generator=torch.Generator().manual_seed(0))
    with pytest.raises(RuntimeError, match="diverged"), transaction(model):
        _update(model)
    assert model.state is state and model.child.count == count
    assert model.basis is basis and torch.equal(basis, torch.arange(3.0))
    assert dict(model.named_parameters())["basis"] is basis
    assert torch.equal(model.child.weight, weight)
    assert torch.equal(torch.rand(3, generator=model.generator), draw)
    assert torch.equal(model.selector.points, torch.zeros(2))
    assert model.rollbacks == 1


def test_a_successful_update_is_kept():
    model = _Model()
    with transaction(model):
        model.state = torch.zeros(5)
    assert model.state.shape == (5,) and model.rollbacks == 0
