"""The format of public identifiers, shared by the server that mints them and the client that
puts them into URL paths: a short type prefix, ``_``, and the lowercase base32 text of
:data:`ID_RANDOM_BYTES` random bytes (``run_…``, ``bkg_…``, ``cfr_…``)."""

from __future__ import annotations

import re

__all__ = ["ID_BODY_CHARS", "ID_RANDOM_BYTES", "is_public_id"]

ID_RANDOM_BYTES = 15
"""Random bytes behind each id; a multiple of 5, so its base32 text needs no padding."""
ID_BODY_CHARS = ID_RANDOM_BYTES * 8 // 5
"""Length of the random part: 24 characters of ``a-z2-7``."""
_BODY = re.compile(rf"[a-z2-7]{{{ID_BODY_CHARS}}}")


def is_public_id(value: str, prefix: str) -> bool:
    """Whether ``value`` is exactly an id of kind ``prefix`` as the server mints them."""
    head, sep, body = value.partition("_")
    return head == prefix and sep == "_" and _BODY.fullmatch(body) is not None
