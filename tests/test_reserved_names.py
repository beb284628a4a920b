"""Names that Program.run() takes itself can never name a graph input."""
import inspect

import pytest

import megak
from megak.reserved import RESERVED_NAMES


@pytest.mark.parametrize("name", sorted(RESERVED_NAMES))
def test_reserved_name_is_refused_as_an_input(name):
    with pytest.raises(megak.GraphError, match=name):
        megak.Graph().input(name, (2, 2))


def test_every_keyword_of_run_is_reserved():
    params = inspect.signature(megak.Program.run).parameters.values()
    keywords = {p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert keywords and keywords <= RESERVED_NAMES


def test_reserved_names_include_self_and_the_planned_stream():
    assert {"self", "stream", "out", "trace"} <= RESERVED_NAMES
    assert isinstance(RESERVED_NAMES, frozenset)
