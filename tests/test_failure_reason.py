"""What a failed trial's record says: the reason one line can hold (trainables/loop/failures.py)."""

from accelsweep.trainables.loop.failures import one_line


def _raised(function):
    try:
        function()
    except Exception as error:  # noqa: BLE001 - the error is the subject
        return error
    raise AssertionError("it did not raise")


def _bare_assert():
    raise AssertionError  # what a bare `assert` raises outside pytest's rewritten modules


def test_a_bare_assert_is_named_with_where_it_was_raised():
    """A trial on a lent H100 failed with 'AssertionError: AssertionError' from inside
    inductor, and nothing else: the file, line and function are the reason there is."""
    reason = one_line(_raised(_bare_assert))
    assert reason.startswith("AssertionError (no message), raised at ")
    assert reason.endswith(f"{__file__}:{_bare_assert.__code__.co_firstlineno + 1} in _bare_assert")


def test_a_message_gives_its_last_line_that_is_not_advice():
    def compile_error():
        raise RuntimeError("backend failed\nInductorError: out of shared memory\nSet TORCH_LOGS=+dynamo for more")

    assert one_line(_raised(compile_error)) == "InductorError: out of shared memory"
