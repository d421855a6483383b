"""The one stopping rule (engine/stopping.py) that generations, speculative generations, eviction runs and served
requests follow, on its edges: EOS first, then the answer's limit, then the context; teacher forcing reads past EOS."""

import pytest

from engine.stopping import stop_reason

EOS = {2}


@pytest.mark.parametrize(
    "args, kwargs, reason",
    [
        ((5, EOS, 3, 4, 10, 12), {}, None),
        ((2, EOS, 4, 4, 12, 12), {}, "eos"),  # EOS wins when every limit is met at once
        ((2, EOS, 3, 4, 10, 12), {"ignore_eos": True}, None),
        ((5, EOS, 4, 4, 10, 12), {}, "max_new_tokens"),
        ((5, EOS, 3, 4, 12, 12), {}, "context_limit"),
        ((5, EOS, 3, 4, 11, 12), {}, None),
        ((5, EOS, 3, 4, 10**6), {}, None),  # no context limit: a server checked the request's length when it came
    ],
)
def test_the_stopping_rule(args, kwargs, reason):
    assert stop_reason(*args, **kwargs) == reason
