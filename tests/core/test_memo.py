"""provider/core/memo.py: what leaves the memo is handed to `on_drop` (the mounter's answers die
with it), whatever made it leave."""

from __future__ import annotations

from provider.core.memo import Memo


def test_every_value_that_leaves_is_handed_over_once() -> None:
    dropped: list[str] = []
    memo: Memo[str, str] = Memo(2, 100, on_drop=dropped.append)
    memo.put("a", "va", 1)
    memo.put("b", "vb", 1)
    memo.put("a", "va", 1)  # the same value again: it stays
    memo.put("b", "vb2", 1)  # replaced
    memo.put("c", "vc", 1)  # evicts the least recently used: "a"
    memo.drop("c")
    memo.drop("missing")
    memo.put("huge", "vh", 101)  # refused: it never entered
    assert dropped == ["vb", "va", "vc"]
    assert memo.get("b") == "vb2" and len(memo) == 1
