"""Messages of gathered failures: each object named once, however its cause was worded."""

from __future__ import annotations

from provider.core.errors import InvalidParameters, MountFailed, NotFound


def test_an_object_is_named_once_even_when_its_cause_names_it() -> None:
    failed = MountFailed(
        [
            ("c", InvalidParameters("object 'c': extract expression 'x' matched nothing")),
            ("d", NotFound("no secret at 'd'")),
        ],
        context="fake",
    )
    text = str(failed)
    assert text.count("object 'c'") == 1 and text.count("object 'd'") == 1
    assert text == (
        "2 objects failed: object 'c': extract expression 'x' matched nothing; "
        "object 'd': no secret at 'd' (fake)"
    )
