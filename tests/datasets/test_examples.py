import doctest

import pytest

from streamgp.datasets import loaders, malaria, preprocessing, registry, synthetic


@pytest.mark.parametrize("module", [registry, loaders, preprocessing, synthetic, malaria])
def test_docstring_examples_run(module):
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
