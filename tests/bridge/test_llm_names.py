"""Tool names as OpenAI function calling accepts them (pure logic)."""

from __future__ import annotations

from toolservice_base.names import OPENAI_NAME, openai_names


def test_valid_names_are_kept_as_they_are() -> None:
    assert openai_names(["tell-joke", "calculate", "A_b-9"]) == {
        "tell-joke": "tell-joke",
        "calculate": "calculate",
        "A_b-9": "A_b-9",
    }


def test_dots_become_underscores() -> None:
    assert openai_names(["acme.search.v2"]) == {"acme.search.v2": "acme_search_v2"}


def test_a_name_over_64_characters_is_cut_and_ends_in_a_hash_of_the_whole_name() -> None:
    long_a, long_b = "x" * 100 + "a", "x" * 100 + "b"
    names = openai_names([long_a, long_b])
    assert all(OPENAI_NAME.match(n) for n in names.values())
    assert names[long_a] != names[long_b] and names[long_a].startswith("x" * 55 + "_")


def test_a_changed_name_never_takes_the_name_of_another_tool() -> None:
    names = openai_names(["a.b", "a_b"])
    assert names["a_b"] == "a_b"
    assert names["a.b"] != "a_b" and OPENAI_NAME.match(names["a.b"])


def test_the_mapping_is_one_to_one_and_the_same_for_the_same_set() -> None:
    given = ["a.b", "a_b", "a-b", "a.b.c", "a_b_c", "q" * 128, "q" * 127 + "r"]
    first = openai_names(given)
    assert len(set(first.values())) == len(given)
    assert openai_names(reversed(given)) == first
