"""`core.error_chain`: the errors behind an error, nearest first, each once."""

from __future__ import annotations

from core.error_chain import error_chain


def _raised_from(cause: BaseException) -> BaseException:
    try:
        raise RuntimeError("wrapper") from cause
    except RuntimeError as exc:
        return exc


def _raised_while_handling(handled: BaseException) -> BaseException:
    try:
        try:
            raise handled
        except type(handled):
            raise ValueError("met while handling")  # its context: the one handled
    except ValueError as exc:
        return exc


def test_the_chain_follows_what_each_error_was_raised_from() -> None:
    root = OSError("socket")
    wrapper = _raised_from(root)
    assert list(error_chain(wrapper)) == [wrapper, root]


def test_an_error_raised_while_handling_another_leads_to_it_unless_only_causes_count() -> None:
    handled = OSError("outage")
    met = _raised_while_handling(handled)
    assert list(error_chain(met)) == [met, handled]
    assert list(error_chain(met, handled=False)) == [met]


def test_a_chain_that_loops_back_ends() -> None:
    first, second = OSError("a"), OSError("b")
    first.__cause__, second.__cause__ = second, first
    assert list(error_chain(first)) == [first, second]
