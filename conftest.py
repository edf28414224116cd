r"""Pytest configuration shared by tests/ and the docstring examples under src/.

``pytest -q`` runs both (pyproject: ``testpaths = ["tests", "src"]``, ``--doctest-modules``).
"""

from importlib.util import find_spec

import pytest
import torch

#: Modules whose import needs an optional extra (``pip install 'streamgp[...]'``): their
#: examples are not collected when the extra is missing. CI installs every extra.
OPTIONAL_MODULES = {
    "src/streamgp/ax.py": ("ax",),  # streamgp[ax]
}

collect_ignore = [
    path
    for path, requirements in OPTIONAL_MODULES.items()
    if any(find_spec(name) is None for name in requirements)
]


def pytest_ignore_collect(collection_path, config):
    # conftest.py files hold no examples; --doctest-modules would import each one as a
    # module named ``conftest`` and fail on the second (pytest >= 9).
    if collection_path.name == "conftest.py":
        return True
    return None


@pytest.fixture(autouse=True)
def _seed():
    # Every example (and test: tests/conftest.py does the same) starts from one state.
    torch.manual_seed(0)
