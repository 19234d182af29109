"""How many examples a property test draws: its full count, or a quarter of it in the fast run.

``make test-fast`` deselects the slow tests (``-m "not slow ..."``); for that selection
``tests/conftest.py`` sets ``FAST_RUN`` before any test module is imported, so the
``settings(max_examples=examples(N))`` of a module reads it. A full run (``make test``, CI, a
plain ``pytest``) draws all N; the fast run draws fewer of the same strategies, with the same
``derandomize`` setting.
"""

from __future__ import annotations

import math
import re

#: True in a run that deselects the slow tests: ``examples`` returns a quarter of each count.
FAST_RUN = False
_NOT_SLOW = re.compile(r"\bnot\s+slow\b")


def deselects_slow(markexpr: str) -> bool:
    """True when the ``-m`` expression ``markexpr`` leaves the slow tests out."""
    return bool(_NOT_SLOW.search(markexpr or ""))


def examples(n: int) -> int:
    """``n`` in a full run; in the fast run a quarter of it, at least 3 (and never above ``n``)."""
    if not FAST_RUN:
        return n
    return min(n, max(3, math.ceil(n / 4)))
