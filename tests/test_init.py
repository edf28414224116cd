"""The package's top level (``streamgp/__init__.py``)."""

from botorch.models.model import Model

import streamgp
import streamgp.models


def test_every_model_is_importable_from_the_top_level():
    models = {
        name
        for name in streamgp.models.__all__
        if isinstance(getattr(streamgp.models, name), type)
        and issubclass(getattr(streamgp.models, name), Model)
    }
    assert len(models) == 9
    assert models <= set(streamgp.__all__)
    assert all(getattr(streamgp, name) is getattr(streamgp.models, name) for name in models)
