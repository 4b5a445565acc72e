"""`toolreg serve MODULE:CLASS` names what is wrong with the target: the module, the name, or what the name is."""

from __future__ import annotations

import pytest

from discovery.cli.common import CommandError
from discovery.cli.serve import load_service_class
from toolservice_base.examples.joke import JokeService


def test_a_real_service_class_loads() -> None:
    assert load_service_class("toolservice_base.examples.joke:JokeService") is JokeService


def test_a_name_the_module_does_not_have_is_said_so() -> None:
    with pytest.raises(CommandError) as missing:
        load_service_class("toolservice_base.examples.joke:Missing")
    assert "module 'toolservice_base.examples.joke' has no 'Missing'" in str(missing.value)
    assert "subclass" not in str(missing.value)


@pytest.mark.parametrize(
    ("target", "says"),
    [
        ("json:JSONDecoder", "'json:JSONDecoder' is the class JSONDecoder, not a DynamicToolService subclass"),
        ("json:dumps", "'json:dumps' is a function, not a DynamicToolService subclass"),
    ],
)
def test_a_name_that_is_not_a_service_says_what_it_is(target: str, says: str) -> None:
    with pytest.raises(CommandError) as wrong:
        load_service_class(target)
    assert str(wrong.value) == says


def test_a_module_that_does_not_import_is_said_so() -> None:
    with pytest.raises(CommandError, match="cannot import 'no_such_module'"):
        load_service_class("no_such_module:Thing")
