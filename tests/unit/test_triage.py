"""The normaliser behind triage by cause, and the LIKE patterns its groups and filters become."""

from __future__ import annotations

import pytest

from eventbus.backends._sql import contains_like, message_like
from eventbus.triage import MESSAGE_CHARS, error_type_of, normalise


@pytest.mark.parametrize(
    ("error", "normalised"),
    [
        ("KeyError: order 1234 not found", "KeyError: order <n> not found"),
        ("ValueError: amount -3.5 below 0", "ValueError: amount <n> below <n>"),
        ("LookupError: no user 3f2a1c9e-1111-2222-3333-444455556666", "LookupError: no user <uuid>"),
        ("RuntimeError: card 'c-19 x' declined", "RuntimeError: card <str> declined"),
        ('RuntimeError: bad "x"', "RuntimeError: bad <str>"),
        ("OSError: at 0x7f3a, digest deadbeef01", "OSError: at <hex>, digest <hex>"),
        ("Http2Error: stream ord_12ab reset", "Http2Error: stream <id> reset"),
        ("no type here 42", "no type here <n>"),
        ("ConnectionError: host 10.0.73.1 refused", "ConnectionError: host <n> refused"),
        ("OSError: after 3s (limit 2.5ms) for bad-7", "OSError: after <n>s (limit <n>ms) for bad-<n>"),
        ("TimeoutError: took too long", "TimeoutError: took too long"),
    ],
)
def test_normalise_replaces_what_varies(error: str, normalised: str) -> None:
    assert normalise(error) == normalised


def test_normalise_keeps_the_type_and_cuts_long_messages() -> None:
    assert error_type_of("pkg.mod.Oops: x") == "pkg.mod.Oops"
    assert error_type_of("not a type: x y") == ""
    long = normalise("ValueError: " + "word " * 200)
    assert len(long) == MESSAGE_CHARS and long.endswith("…")


def test_like_patterns_take_text_literally() -> None:
    assert contains_like("100%_a\\b") == "%100\\%\\_a\\\\b%"
    assert contains_like("") == "%%" and contains_like(None) is None
    assert message_like("KeyError: order <n> of <str> 5%") == "KeyError: order % of % 5\\%"
    assert message_like("ValueError: long…") == "ValueError: long%"
