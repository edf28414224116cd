"""PersistentOptimizerMixin: one optimizer kept across batches while its tensors persist."""

import torch

from streamgp.models.utils.optimization import PersistentOptimizerMixin


class _Model(PersistentOptimizerMixin, torch.nn.Module):
    def __init__(self, keep=True):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(3))
        self._init_optimizer(torch.optim.Adam, None, 0.1, keep)

    def _trainable_parameters(self):
        return [p for p in self.parameters() if p.requires_grad]


def test_the_optimizer_and_its_state_persist_while_the_parameters_do():
    model = _Model()
    optimizer = model._get_optimizer()
    assert optimizer.param_groups[0]["lr"] == 0.1
    model.weight.sum().backward()
    optimizer.step()
    assert model._get_optimizer() is optimizer and optimizer.state[model.weight]["step"] == 1
    model.weight = torch.nn.Parameter(torch.ones(3))  # a replaced tensor: new optimizer
    assert model._get_optimizer() is not optimizer


def test_new_settings_or_no_kept_state_build_a_new_optimizer():
    model = _Model()
    optimizer = model._get_optimizer()
    model.optimizer_kwargs = {"lr": 0.5}
    rebuilt = model._get_optimizer()
    assert rebuilt is not optimizer and rebuilt.param_groups[0]["lr"] == 0.5
    fresh = _Model(keep=False)
    assert fresh._get_optimizer() is not fresh._get_optimizer()


def test_no_trainable_parameters_gives_no_optimizer():
    model = _Model()
    model.weight.requires_grad_(False)
    assert model._get_optimizer() is None
