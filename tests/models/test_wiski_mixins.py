"""WiskiGP's jobs live in mixins (streamgp.models._wiski): they resolve as one class would."""

import inspect

from streamgp.models import WiskiGP


def _own_names(cls: type) -> set[str]:
    return {name for name in vars(cls) if not (name.startswith("__") and name.endswith("__"))}


def test_the_mixins_define_no_name_twice_and_come_before_the_other_bases():
    bases = WiskiGP.__bases__
    mixins = [base for base in bases if base.__module__.startswith("streamgp.models._wiski.")]
    assert len(mixins) == 8
    assert list(bases[: len(mixins)]) == mixins  # first: nothing else in the MRO comes between
    seen = _own_names(WiskiGP)
    for mixin in mixins:
        assert mixin.__bases__ == (object,)
        assert "__init__" not in vars(mixin)  # no state of their own
        names = _own_names(mixin)
        assert names and not names & seen, (mixin.__name__, names & seen)
        seen |= names
    # Every public method of the model is found where its job is.
    assert inspect.getattr_static(WiskiGP, "observe").__module__ == "streamgp.models._wiski.updates"
    assert WiskiGP.__module__ == "streamgp.models.wiski"
