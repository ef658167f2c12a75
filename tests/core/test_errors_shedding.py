"""shed_tracebacks: a store error's whole chain loses its tracebacks, and nothing else."""

from __future__ import annotations

import itertools

from provider.core.errors import StoreUnavailable, shed_tracebacks


def _raised_chain() -> StoreUnavailable:
    try:
        try:
            raise ConnectionResetError("reset by peer")
        except ConnectionResetError as reset:
            try:
                raise OSError("while closing") from None  # context kept, suppressed
            except OSError:
                raise StoreUnavailable("Vault is unreachable") from reset
    except StoreUnavailable as error:
        return error


def test_the_error_its_cause_and_its_context_lose_their_tracebacks() -> None:
    error = _raised_chain()
    closing = error.__context__
    assert closing is not None and closing.__context__ is not None
    chain = [error, error.__cause__, closing, closing.__context__]
    assert all(e is not None and e.__traceback__ is not None for e in chain)
    shed_tracebacks(error)
    assert all(e is not None and e.__traceback__ is None for e in chain)
    # What the error says, and what it was raised from, stay.
    assert str(error) == "Vault is unreachable"
    assert isinstance(error.__cause__, ConnectionResetError)


def test_a_looping_chain_ends() -> None:
    first, second = ValueError("a"), ValueError("b")
    first.__context__, second.__context__ = second, first  # only by hand, but possible
    shed_tracebacks(first)
    assert first.__traceback__ is None and second.__traceback__ is None


def test_a_long_chain_is_walked_only_so_far() -> None:
    errors = [ValueError(str(i)) for i in range(100)]
    for error, cause in itertools.pairwise(errors):
        error.__cause__ = cause
    try:
        raise errors[-1]
    except ValueError:
        pass
    shed_tracebacks(errors[0])  # bounded work whatever the chain: its tail is left as it is
    assert errors[-1].__traceback__ is not None
