"""Path and query parameters shared by several routes, with their bounds.

A path id is never refused for its shape: a client cannot know our id grammar, so an
id that names nothing is `404` with the route's own not-found code, whatever it looks
like. `unknown_ids_are_not_found` (in the app's `before_request`) answers that before
the handler runs for any id that cannot be one, so no odd value (a NUL, which PostgreSQL
refuses outright, or a megabyte of text) ever reaches a query; the rest are looked up.
A cursor is ours to hand out, so a malformed one stays a validation error.

An integer query parameter or header is written in decimal digits (a leading `-` is
read, then refused by the parameter's range): Litestar converts a query string loosely,
and would take `1e1` or `2.0` as `10` or `2`. `integers_are_digits` refuses what is not
digits before Litestar converts it, with the 422 `validation_error` naming the
parameter that Litestar's own validation answers. A leading zero (`05`) is refused
there too, with words that say so: msgspec, which converts the value, reads a number as
JSON writes one, where `05` is none, and answered "Expected `int`, got `str`".
"""

from __future__ import annotations

import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Union, get_args, get_origin
from weakref import WeakKeyDictionary

from litestar import Request
from litestar.enums import ParamType
from litestar.exceptions import ValidationException
from litestar.handlers import BaseRouteHandler
from litestar.params import Parameter, ParameterKwarg
from litestar.typing import FieldDefinition

from core.clients import is_pairing_code_id
from core.decimal_text import NOT_DECIMAL, is_decimal_integer
from core.errors import NotFound
from core.ids import could_be_id
from core.models_registry import could_be_model_id

ID_PATTERN = r"^[a-z]{1,12}_[0-9a-z]{1,40}$"

TaskId = Annotated[str, Parameter(description="a task id (the same as its response id)")]
ClientId = Annotated[str, Parameter(description="a client id")]
ScheduleId = Annotated[str, Parameter(description="a schedule id")]
Cursor = Annotated[str | None, Parameter(pattern=ID_PATTERN, max_length=64,
                                         description="`next_cursor` of the previous page")]
PageLimit = Annotated[int, Parameter(ge=1, le=100)]

# Every path parameter that names a stored thing: its not-found code and its grammar.
_ID_PARAMS = {
    "task_id": ("task_not_found", could_be_id),
    "response_id": ("task_not_found", could_be_id),
    "client_id": ("client_not_found", could_be_id),
    "schedule_id": ("schedule_not_found", could_be_id),
    "model_id": ("model_not_found", could_be_model_id),
    "code_id": ("pairing_code_not_found", is_pairing_code_id),
}


def model_id_of(path_value: str) -> str:
    """A model id from a `{model_id:path}` parameter, which keeps the leading `/`."""
    return path_value.removeprefix("/")


def id_not_found(name: str) -> NotFound:
    """The `404` of an id given as the path parameter `name` that names nothing the
    caller may see, with that route's own code (`task_not_found` for `task_id`)."""
    code = _ID_PARAMS[name][0]
    return NotFound(code, "no such " + name.removesuffix("_id"))


async def before_handling(request: Request[Any, Any, Any]) -> None:
    """The app's `before_request`: the checks above, before any parameter is converted.

    Async on purpose: Litestar runs a sync `before_request` on a worker thread, a
    thread hop on every request for checks that take microseconds."""
    unknown_ids_are_not_found(request)
    integers_are_digits(request)


def unknown_ids_are_not_found(request: Request[Any, Any, Any]) -> None:
    for name, value in request.path_params.items():
        known = _ID_PARAMS.get(name)
        if known is None:
            continue
        _, could_be = known
        text = model_id_of(value) if name == "model_id" else value
        if not isinstance(text, str) or not could_be(text):
            raise id_not_found(name)


@dataclass(frozen=True)
class _IntegerParameter:
    field: str  # the handler's name for it, which a validation error names
    sent_as: str  # the query key or header name the client sends it under
    in_header: bool


# Per route handler's function, worked out from its signature on its first request.
# Keyed by the function: a handler Litestar makes itself (the one that answers
# `OPTIONS`) is an object no weak reference can point at.
_INTEGERS: WeakKeyDictionary[Callable[..., Any], tuple[_IntegerParameter, ...]] = (
    WeakKeyDictionary())


def integers_are_digits(request: Request[Any, Any, Any]) -> None:
    for parameter in _integer_parameters(request.route_handler):
        if parameter.field in request.path_params:
            continue  # the router converted it, from digits only
        sent = (request.headers.getall(parameter.sent_as, ()) if parameter.in_header
                else request.query_params.getall(parameter.sent_as, ()))
        if not all(is_decimal_integer(value) for value in sent):
            source = "header" if parameter.in_header else "query"
            raise ValidationException(extra=[{
                "key": parameter.field, "source": source,
                "message": NOT_DECIMAL}])


def _integer_parameters(handler: BaseRouteHandler) -> tuple[_IntegerParameter, ...]:
    known = _INTEGERS.get(handler.fn)
    if known is None:
        known = _INTEGERS[handler.fn] = tuple(
            parameter for name, field in handler.parsed_fn_signature.parameters.items()
            if (parameter := _as_integer_parameter(name, field)) is not None)
    return known


def _as_integer_parameter(name: str, field: FieldDefinition) -> _IntegerParameter | None:
    """`name` as a query parameter or header that holds an integer, else None."""
    if not _is_integer(field.annotation):
        return None
    kwarg = field.kwarg_definition
    if not isinstance(kwarg, ParameterKwarg):
        return _IntegerParameter(name, name, in_header=False)
    if kwarg.param_type not in (ParamType.QUERY, ParamType.HEADER):
        return None
    return _IntegerParameter(name, kwarg.name or name,
                             in_header=kwarg.param_type is ParamType.HEADER)


def _is_integer(annotation: Any) -> bool:
    """`int` or `int | None`; not `bool`, which Litestar reads as `true`/`false`."""
    if get_origin(annotation) in (Union, types.UnionType):
        return set(get_args(annotation)) - {types.NoneType} == {int}
    return annotation is int
