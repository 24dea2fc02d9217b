"""Characters no person may be shown as they are, and a check that a text shows none of them.

Decided here from the Unicode categories themselves, not by calling the agent's `printable`: a test
of what a page or a message shows must not pass by comparing the code with itself.
"""

from __future__ import annotations

import unicodedata

__all__ = ["INVISIBLE", "LOOK_ALIKE", "OVERDRAWN", "hidden_in"]

# Each draws nothing, reorders the text around it, or draws over its neighbour.
INVISIBLE = {
    "zero-width space": "\u200b",
    "zero-width joiner": "\u200d",
    "word joiner": "\u2060",
    "byte order mark": "\ufeff",
    "soft hyphen": "\u00ad",
    "left-to-right mark": "\u200e",
    "right-to-left mark": "\u200f",
    "arabic letter mark": "\u061c",
    "right-to-left isolate": "\u2067",
    "right-to-left override": "\u202e",
    "tag latin small a": "\U000e0061",
    "cancel tag": "\U000e007f",
    "combining acute accent": "\u0301",
    "combining grapheme joiner": "\u034f",
    "variation selector 16": "\ufe0f",
    "combining enclosing circle": "\u20dd",
    "no-break space": "\u00a0",
    "hangul filler": "\u3164",
}
# Shown as is, it reads like "GPU-1" followed by nothing.
LOOK_ALIKE = "GPU-1\u200b"
# Shown as is, a stack of combining marks drawn high above and below its tile.
OVERDRAWN = "GPU-Z" + "\u0489\u030d\u0346\u0353" * 40

_HIDDEN = {"Cc", "Cf", "Mn", "Me", "Zl", "Zp", "Cs", "Co", "Cn"}
_BLANK_LETTERS = {"\u115f", "\u1160", "\u3164", "\uffa0"}


def hidden_in(text: str, *, allowed: str = "") -> list[str]:
    """The characters of `text` that a person would not see as themselves (as `U+XXXX`), but for
    those in `allowed` (a message's own line breaks, say)."""
    return [
        f"U+{ord(c):04X}"
        for c in text
        if c not in allowed
        and (
            unicodedata.category(c) in _HIDDEN
            or (unicodedata.category(c) == "Zs" and c != " ")
            or c in _BLANK_LETTERS
        )
    ]
