import sys
from pathlib import Path

import pytest
import torch

# Shared oracles (tests/oracles.py) are imported as a plain module.
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
