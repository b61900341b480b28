"""The supervisor's hand-written JSON encoder (it avoids importing json on the create path)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from provider.emulator.guest_channel import SIGNAL_NAMES, SIGNAL_NUMBERS, to_json

# Lone high surrogates are excluded: two of them in a row would read back as one pair. Paths
# decoded with surrogateescape only ever contain low surrogates (U+DC80..U+DCFF).
text = st.text(
    alphabet=st.characters(blacklist_categories=(), exclude_characters=None).filter(
        lambda ch: not 0xD800 <= ord(ch) <= 0xDBFF
    )
)
values = st.recursive(
    st.none() | st.booleans() | st.integers() | text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
    max_leaves=12,
)


@given(values)
def test_to_json_round_trips(value: Any) -> None:
    encoded = to_json(value)
    assert encoded.isascii()
    assert json.loads(encoded) == value


def test_signal_tables_use_canonical_names() -> None:
    assert SIGNAL_NAMES[9] == "SIGKILL" and SIGNAL_NAMES[17] == "SIGCHLD"
    assert SIGNAL_NUMBERS["SIGTERM"] == 15 and "SIGCLD" not in SIGNAL_NUMBERS
