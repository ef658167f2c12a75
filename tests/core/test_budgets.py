"""provider/core/budgets.py: one bucket per namespace, bounded in how many namespaces it
tracks, and no refusal left uncounted past the bound."""

from __future__ import annotations

from provider.core.budgets import OTHERS, Budgets, TokenBucket


def test_a_bucket_refills_at_its_rate_up_to_its_burst() -> None:
    bucket = TokenBucket(2, 1.0, now=0.0)
    assert bucket.take(2, 0.0) and not bucket.take(1, 0.0)
    assert bucket.wait(1) == 1.0
    assert bucket.take(1, 1.0)
    assert bucket.refill(100.0) == 2  # never more than the burst


def test_namespaces_past_the_bound_share_one_bucket_and_their_refusals_are_counted() -> None:
    budgets = Budgets(2, 1.0, most=2)
    for namespace in ("a", "b"):
        assert budgets.allows(namespace, 2, 0.0)
        budgets.spend(namespace, 2)
    # "c" and "d" are not tracked: they share the others' bucket, which they spend between them.
    assert budgets.allows("c", 1, 0.0)
    budgets.spend("c", 1)
    assert budgets.allows("d", 1, 0.0)
    budgets.spend("d", 1)
    assert not budgets.allows("e", 1, 0.0)
    assert budgets.dropped("e") == (0, 0.0)  # counted under the shared bucket, not its own
    assert budgets.dropped(OTHERS) == (1, 0.0)
    reported: list[tuple[str, int, float]] = []
    budgets.sweep(10.0, lambda *line: reported.append(line) or True, older_than=5)
    assert reported == [(OTHERS, 1, 0.0)]
    # Every bucket is full again with nothing to report: forgotten, so "e" gets its own now.
    assert budgets.allows("e", 2, 10.0) and budgets.dropped(OTHERS) == (0, 0.0)


def test_a_count_that_could_not_be_written_is_kept_for_the_next_sweep() -> None:
    budgets = Budgets(1, 1.0)
    budgets.allows("a", 1, 0.0)
    budgets.spend("a", 1)
    assert not budgets.allows("a", 1, 0.0)
    budgets.sweep(10.0, lambda *_line: False, older_than=5)
    assert budgets.dropped("a") == (1, 0.0)
    budgets.carried("a")
    assert budgets.dropped("a") == (0, 0.0)
