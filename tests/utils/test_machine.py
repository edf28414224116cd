"""machine_info: the provenance recorded in every results file."""

import doctest
import os

import torch

from streamgp.utils import machine
from streamgp.utils.machine import machine_info


def test_records_threads_load_versions_and_extras():
    info = machine_info(dtype="float64")
    assert info["torch_threads"] == torch.get_num_threads()
    assert info["cpu_count"] == os.cpu_count()
    assert info["torch"] == torch.__version__
    assert info["device"] == "cpu" and "gpu" not in info
    assert len(info["load_average"]) == 3
    assert info["dtype"] == "float64"


def test_docstring_example_runs():
    assert doctest.testmod(machine).failed == 0
