"""How a tool is declared: a factory that returns an async `execute`.

The `execute` signature and its docstring (`Args:` section) are the model-facing
schema, so a tool is never described twice. `ToolError` goes back to the model as
the tool's output; any other exception is a harness error.
"""

from __future__ import annotations

import copy
import errno
import inspect
import re
import types
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from labkube.agent.messages import ToolSpec
from labkube.sandbox import SandboxFailed

Access = Literal["read", "write"]


class ToolError(Exception):
    """A problem the model can act on; its message is the tool's output."""


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]
    execute: Callable[..., Awaitable[str]]
    access: Access

    @property
    def spec(self) -> ToolSpec:
        return ToolSpec(name=self.name, description=self.description, parameters=self.parameters)

    async def __call__(self, arguments: dict[str, Any]) -> str:
        known = self.parameters["properties"]
        unknown = sorted(set(arguments) - set(known))
        if unknown:
            raise ToolError(f"{self.name}: unknown argument(s) {', '.join(unknown)}; expected {', '.join(known)}")
        missing = [p for p in self.parameters.get("required", []) if p not in arguments]
        if missing:
            raise ToolError(f"{self.name}: missing required argument(s) {', '.join(missing)}")
        for key, value in arguments.items():
            expected = known[key].get("type")
            if expected and not _json_type_ok(value, expected):
                raise ToolError(f"{self.name}: argument {key!r} must be {expected}, got {type(value).__name__}")
        try:
            return await self.execute(**arguments)
        except (ValueError, OverflowError, UnicodeError, OSError, RuntimeError) as exc:
            if isinstance(exc, ToolError | SandboxFailed):  # a sandbox that could not be made is the harness's failure
                raise
            if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise
            raise ToolError(f"{self.name}: {type(exc).__name__}: {str(exc)[:300]}") from None


def _json_type_ok(value: object, expected: str) -> bool:
    checks: dict[str, Callable[[object], bool]] = {
        "string": lambda v: isinstance(v, str),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
        "boolean": lambda v: isinstance(v, bool),
        "array": lambda v: isinstance(v, list),
        "object": lambda v: isinstance(v, dict),
    }
    return checks.get(expected, lambda v: True)(value)


_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object"}


def _json_schema_for(annotation: Any) -> dict[str, Any]:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _json_schema_for(args[0]) if args else {}
    if origin is Literal:
        return {"type": "string", "enum": list(typing.get_args(annotation))}
    if origin in (list, tuple):
        (item,) = typing.get_args(annotation)[:1] or (str,)
        return {"type": "array", "items": _json_schema_for(item)}
    return {"type": _JSON_TYPES.get(origin or annotation, "string")}


def parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """Description and per-argument help from a Google-style docstring."""
    doc = inspect.cleandoc(doc)
    head, _, rest = doc.partition("\nArgs:")
    args: dict[str, str] = {}
    current = None
    for line in rest.splitlines():
        match = re.match(r"^\s{2,}(\w+)(?:\s*\([^)]*\))?:\s*(.*)$", line)
        if match:
            current = match.group(1)
            args[current] = match.group(2).strip()
        elif current and line.strip() and not re.match(r"^\S", line):
            args[current] += " " + line.strip()
        elif line.strip() and re.match(r"^\S", line):
            break
    return head.strip(), args


_descriptions: dict[tuple[types.CodeType, str], tuple[str, dict[str, Any]]] = {}


def _described(execute: Callable[..., Awaitable[str]]) -> tuple[str, dict[str, Any]]:
    """The description and parameter schema of an `execute`, worked out once per process for each (its code, its
    docstring): every `execute` a factory returns has the same (the agent zygote works them out before it forks)."""
    assert execute.__doc__
    key = (execute.__code__, execute.__doc__)
    if key not in _descriptions:
        description, arg_help = parse_docstring(execute.__doc__)
        hints = typing.get_type_hints(execute)
        properties: dict[str, Any] = {}
        required = []
        for pname, param in inspect.signature(execute).parameters.items():
            schema = _json_schema_for(hints.get(pname, str))
            if pname in arg_help:
                schema["description"] = arg_help[pname]
            properties[pname] = schema
            if param.default is inspect.Parameter.empty:
                required.append(pname)
        params = {"type": "object", "properties": properties, "required": required, "additionalProperties": False}
        _descriptions[key] = (description, params)
    return _descriptions[key]


def tool(
    *, access: Access, name: str | None = None
) -> Callable[[Callable[..., Callable[..., Awaitable[str]]]], Callable[..., Tool]]:
    """Mark a factory whose returned `execute` is a tool; `access` tags it read or write for audits."""

    def wrap(factory: Callable[..., Callable[..., Awaitable[str]]]) -> Callable[..., Tool]:
        def make(*args: Any, **kwargs: Any) -> Tool:
            execute = factory(*args, **kwargs)
            if not execute.__doc__:
                raise TypeError(f"tool {factory.__name__}: execute() has no docstring to describe it to the model")
            description, params = _described(execute)
            return Tool(name or factory.__name__, description, copy.deepcopy(params), execute, access)

        make.__name__ = factory.__name__
        make.__doc__ = factory.__doc__
        return make

    return wrap
