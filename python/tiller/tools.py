"""Python functions as agent tools: `@tiller.tool` reads a function's name, docstring and type hints into the
tool's name, description and JSON Schema; Tiller validates the model's arguments against that schema before
the function is called.

A plain function runs on one of Tiller's worker threads (the interpreter's exit waits for calls under way); a
coroutine function on the event loop the agent was spawned from. Whatever a tool raises ends as an error result the model reads, never as a crash of the agent.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import inspect
import json
import re
import threading
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Callable

from .errors import NeedsApproval, NeedsInput, ToolError

try:  # pydantic is welcome, not required.
    import pydantic as _pydantic
except ImportError:  # pragma: no cover - exercised where pydantic is absent
    _pydantic = None


@dataclass
class AgentContext:
    """Who an agent works for: user, tenant, session and client ids, whether it is an evaluation, and the
    states its tools keep (by name)."""

    user_id: str | None = None
    tenant_id: str | None = None
    session_id: str | None = None
    client_id: str | None = None
    evaluation: bool = False
    default_model: str | None = None
    agent_schema_uri: str | None = None
    anonymous_id: str | None = None
    agents: list[str] = field(default_factory=list)
    states: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_headers(cls, headers: typing.Mapping[str, str] | typing.Iterable[tuple[str, str]]) -> AgentContext:
        """A context from request headers (`X-User-Id`, `X-Tenant-Id`, `X-Session-Id`, `X-Client-Id`,
        `X-Evaluation`/`X-Is-Eval`, `X-Model-Name`, `X-Agent-Schema`, `X-Anonymous-Id`), read by the same rule as Rust's
        `AgentContext::from_headers`. Only for headers from a trusted source: anyone can send them."""
        from . import _native

        pairs = list(headers.items()) if isinstance(headers, typing.Mapping) else list(headers)
        return cls._from_json(json.loads(_native.context_from_headers(pairs)))

    @classmethod
    def _from_json(cls, data: dict[str, Any]) -> AgentContext:
        ids = data.get("ids", data)
        return cls(
            user_id=ids.get("user_id"),
            tenant_id=ids.get("tenant_id"),
            session_id=ids.get("session_id"),
            client_id=ids.get("client_id"),
            evaluation=ids.get("evaluation", False),
            default_model=ids.get("default_model"),
            agent_schema_uri=ids.get("agent_schema_uri"),
            anonymous_id=ids.get("anonymous_id"),
            agents=list(ids.get("agents", [])),
            states=dict(data.get("states", {})),
        )

    def _to_dict(self) -> dict[str, Any]:
        ids = {key: value for key, value in dataclasses.asdict(self).items() if key != "states"}
        return {"ids": ids, "states": self.states}


class ToolContext:
    """What a call gives its tool besides the arguments (a parameter annotated `tiller.ToolContext`)."""

    def __init__(self, call_id: str, approved: bool, answered: bool, context: str) -> None:
        self.call_id = call_id
        self.approved = approved
        self.answered = answered
        self._context = context
        self._agent: AgentContext | None = None
        self._state: dict[str, Any] = {}
        self._cancelled = threading.Event()
        self._task: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"ToolContext(call_id={self.call_id!r}, approved={self.approved}, answered={self.answered})"

    @property
    def agent(self) -> AgentContext:
        """Who the agent works for, and the states its tools keep."""
        if self._agent is None:
            self._agent = AgentContext._from_json(json.loads(self._context))
        return self._agent

    @property
    def cancelled(self) -> bool:
        """Whether the run gave up this call (an abort, a steering message): a plain function polls this; an
        async one is cancelled (`asyncio.CancelledError`) as well."""
        return self._cancelled.is_set()

    @property
    def idempotency_key(self) -> str:
        """The key to pass on to what the call changes: the call's id, the same when the call runs again after
        a restart."""
        return self.call_id

    def state(self, name: str, default: Any = None) -> Any:
        """The agent's state `name`: as this call set it, else as the run started with it."""
        return self._state.get(name, self.agent.states.get(name, default))

    def set_state(self, name: str, value: Any) -> None:
        """Sets the agent's state `name` (JSON): stored with this call's result, the agent's from then on."""
        self._state[name] = value


@dataclass
class ToolOutput:
    """A tool's result: `text` for the model, `details` (JSON) for the interface, `terminate` to end the run
    after this turn."""

    text: str
    details: Any = None
    terminate: bool = False


_MAX_GIVEN_UP = 1024


class Tool:
    """A Python function as an agent tool (made by `@tiller.tool`). Calling it calls the function."""

    def __init__(
        self,
        function: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        sequential: bool = False,
        needs_approval: bool | str = False,
    ) -> None:
        self.function = function
        self.name = name or function.__name__
        doc = inspect.getdoc(function) or ""
        summary, params = _parse_docstring(doc)
        self.description = description or summary or self.name
        self.sequential = sequential
        self.needs_approval = needs_approval
        self.is_async = inspect.iscoroutinefunction(function)
        self._context_param, self._params, self.parameters = _signature_schema(function, params)
        self.takes_context = self._context_param is not None
        self.parameters_json = json.dumps(self.parameters)
        self._running: dict[str, ToolContext] = {}
        # Async calls given up before they started (at most _MAX_GIVEN_UP, the oldest forgotten).
        self._given_up: dict[str, None] = {}
        self._lock = threading.Lock()
        self.__doc__ = function.__doc__
        self.__name__ = self.name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.function(*args, **kwargs)

    def __repr__(self) -> str:
        return f"Tool({self.name!r})"

    # What Tiller's Rust side calls, with a call's arguments (JSON), id, approval, answer and agent context
    # (JSON): `_call_sync` on one of Tiller's worker threads, answering JSON; `_start_async` on the event
    # loop, answering through `reply`. A call the run gives up is told by `_cancel`.

    def _call_sync(self, arguments: str, call_id: str, approved: bool, answered: bool, context: str) -> str:
        ctx = ToolContext(call_id, approved, answered, context)
        # Only a function that reads its context can hear that its call was given up.
        watched = self._context_param is not None and self._watch(ctx)
        try:
            result = self.function(**self._arguments(arguments, ctx))
            if inspect.isawaitable(result):  # an async tool of an agent spawned without a loop
                result = asyncio.run(_awaited(result))
            answer = _answer(result, ctx)
        except BaseException as error:  # every failure of a tool is the model's to read
            answer = _failure(error)
        finally:
            if watched:
                self._unwatch(call_id)
        return answer

    def _start_async(self, arguments: str, call_id: str, approved: bool, answered: bool, context: str, reply: Callable[[str], None]) -> None:
        ctx = ToolContext(call_id, approved, answered, context)
        # The task exists before `_cancel` can find the call; it first runs at the loop's next turn.
        ctx._task = asyncio.get_running_loop().create_task(self._call_async(arguments, ctx, reply))
        if not self._watch(ctx):
            ctx._task.cancel()

    async def _call_async(self, arguments: str, ctx: ToolContext, reply: Callable[[str], None]) -> None:
        try:
            answer = _answer(await self.function(**self._arguments(arguments, ctx)), ctx)
        except asyncio.CancelledError:
            raise
        except BaseException as error:  # SystemExit, KeyboardInterrupt: the call's error, not the loop's
            answer = _failure(error)
        finally:
            self._unwatch(ctx.call_id)
        reply(answer)

    def _arguments(self, arguments: str, ctx: ToolContext) -> dict[str, Any]:
        if self.needs_approval and not ctx.approved:
            reason = self.needs_approval if isinstance(self.needs_approval, str) else f"`{self.name}` needs approval"
            raise NeedsApproval(reason)
        values = json.loads(arguments)
        kwargs = {name: _decode(value, self._params[name]) for name, value in values.items() if name in self._params}
        if self._context_param:
            kwargs[self._context_param] = ctx
        return kwargs

    def _watch(self, ctx: ToolContext) -> bool:
        """Keeps `ctx` where `_cancel` finds it; false when its call was given up already."""
        with self._lock:
            if self._given_up.pop(ctx.call_id, False) is None:
                return False
            self._running[ctx.call_id] = ctx
            return True

    def _unwatch(self, call_id: str) -> None:
        with self._lock:
            self._running.pop(call_id, None)

    def _cancel(self, call_id: str) -> None:
        """The run gave up the call `call_id`: its context says so, and its task (if async) is cancelled."""
        with self._lock:
            ctx = self._running.get(call_id)
            if ctx is None:
                if self.is_async:  # not started yet, or just ended: if it starts, it will not run
                    self._given_up[call_id] = None
                    if len(self._given_up) > _MAX_GIVEN_UP:
                        del self._given_up[next(iter(self._given_up))]
                return
        ctx._cancelled.set()
        if ctx._task is not None:
            ctx._task.get_loop().call_soon_threadsafe(ctx._task.cancel)


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def tool(
    function: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    sequential: bool = False,
    needs_approval: bool | str = False,
) -> Any:
    """Makes an agent tool of a function (sync or async): `@tiller.tool` or `@tiller.tool(name=..., ...)`.

    The description is the docstring's text before its `Args:` section; each parameter's description comes
    from that section (`name: text`) or Sphinx's `:param name: text`. Parameters take `str`, `int`, `float`,
    `bool`, lists, dicts, `Optional`, `Literal`, enums, dataclasses and pydantic models (where installed); a
    parameter annotated `tiller.ToolContext` receives the call's context. `sequential` makes the tool run
    alone; `needs_approval` (or its reason as text) makes every call wait for the user's approval.
    """

    def make(function: Callable[..., Any]) -> Tool:
        return Tool(function, name=name, description=description, sequential=sequential, needs_approval=needs_approval)

    return make(function) if function is not None else make


def _answer(result: Any, ctx: ToolContext) -> str:
    if isinstance(result, ToolOutput):
        text, details, terminate = result.text, result.details, result.terminate
    elif result is None:
        text, details, terminate = "", None, False
    elif isinstance(result, str):
        text, details, terminate = result, None, False
    else:
        details = _jsonable(result)
        text, terminate = json.dumps(details), False
    return json.dumps({"ok": {"text": text, "details": details, "terminate": terminate, "state": ctx._state}})


def _failure(error: BaseException) -> str:
    if isinstance(error, NeedsInput):
        return json.dumps({"needs_input": {"field": error.field, "question": error.question}})
    if isinstance(error, NeedsApproval):
        return json.dumps({"needs_approval": error.reason})
    if isinstance(error, ToolError):
        return json.dumps({"failed": str(error)})
    return json.dumps({"failed": f"{type(error).__name__}: {error}"})


def _jsonable(value: Any) -> Any:
    if _pydantic is not None and isinstance(value, _pydantic.BaseModel):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, enum.Enum):
        return value.value
    return value


# The schema of a function's parameters.

_DOC_SECTION = re.compile(r"^(Args|Arguments|Parameters|Params):\s*$")
_DOC_PARAM = re.compile(r"^\s*(\*{0,2}\w+)\s*(\([^)]*\))?\s*:\s*(.*)$")
_SPHINX_PARAM = re.compile(r"^:param\s+(?:\S+\s+)?(\w+):\s*(.*)$")
_SECTION = re.compile(r"^[A-Z][A-Za-z ]*:$")


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """The docstring's description (before its first section) and its parameters' descriptions."""
    summary: list[str] = []
    params: dict[str, str] = {}
    section: str | None = None  # None (the description), "args", "sphinx" or "other"
    current: str | None = None
    param_indent: int | None = None
    for line in doc.splitlines():
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        sphinx = _SPHINX_PARAM.match(stripped)
        if sphinx:
            section, current = "sphinx", sphinx.group(1)
            params[current] = sphinx.group(2).strip()
            continue
        if indent == 0 and _SECTION.match(stripped):
            section = "args" if _DOC_SECTION.match(stripped) else "other"
            current, param_indent = None, None
            continue
        if section is None:
            summary.append(line)
        elif section == "args" and stripped:
            match = _DOC_PARAM.match(stripped)
            if match and (param_indent is None or indent <= param_indent):
                param_indent, current = indent, match.group(1).lstrip("*")
                params[current] = match.group(3).strip()
            elif current is not None:
                params[current] = f"{params[current]} {stripped}"
        elif section == "sphinx" and stripped and current is not None and not stripped.startswith(":"):
            params[current] = f"{params[current]} {stripped}"
    return "\n".join(summary).strip(), params


def _signature_schema(function: Callable[..., Any], described: dict[str, str]) -> tuple[str | None, dict[str, Any], dict[str, Any]]:
    """The name of the parameter taking the context, each other parameter's annotation, and their JSON Schema."""
    signature = inspect.signature(function)
    try:
        hints = typing.get_type_hints(function, include_extras=True)
    except Exception:  # hints that cannot be resolved describe nothing
        hints = {}
    context_param: str | None = None
    annotations: dict[str, Any] = {}
    properties: dict[str, Any] = {}
    required: list[str] = []
    for name, param in signature.parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        annotation = hints.get(name, Any)
        if annotation is ToolContext:
            context_param = name
            continue
        annotations[name] = annotation
        schema = _schema(annotation)
        if name in described and described[name]:
            schema = {**schema, "description": described[name]}
        if param.default is param.empty:
            required.append(name)
        elif _json_default(param.default) is not _NO_DEFAULT:
            schema = {**schema, "default": _json_default(param.default)}
        properties[name] = schema
    parameters: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        parameters["required"] = required
    # A pydantic model's definitions (`$defs`, which its `$ref`s name from the root) go to the root.
    definitions: dict[str, Any] = {}
    _hoist_definitions(properties, definitions)
    if definitions:
        parameters["$defs"] = definitions
    return context_param, annotations, parameters


def _hoist_definitions(schema: Any, definitions: dict[str, Any]) -> None:
    """Moves every `$defs` found in `schema` into `definitions`."""
    if isinstance(schema, dict):
        found = schema.pop("$defs", None)
        if found:
            for name, definition in found.items():
                _hoist_definitions(definition, definitions)
                definitions[name] = definition
        for value in schema.values():
            _hoist_definitions(value, definitions)
    elif isinstance(schema, list):
        for value in schema:
            _hoist_definitions(value, definitions)


_NO_DEFAULT = object()


def _json_default(value: Any) -> Any:
    value = _jsonable(value)
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return _NO_DEFAULT
    return value


_PRIMITIVES: dict[Any, dict[str, Any]] = {
    str: {"type": "string"},
    int: {"type": "integer"},
    float: {"type": "number"},
    bool: {"type": "boolean"},
    type(None): {"type": "null"},
    dict: {"type": "object"},
    list: {"type": "array"},
}


def _schema(annotation: Any) -> dict[str, Any]:
    """The JSON Schema of a type hint."""
    if annotation is Any or annotation is inspect.Parameter.empty:
        return {}
    if annotation in _PRIMITIVES:
        return dict(_PRIMITIVES[annotation])
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        schema = _schema(args[0])
        notes = [note for note in args[1:] if isinstance(note, str)]
        return {**schema, "description": notes[0]} if notes else schema
    if origin is typing.Union or origin is types.UnionType:
        options = [arg for arg in args if arg is not type(None)]
        if len(options) == 1:
            return _schema(options[0])
        return {"anyOf": [_schema(arg) for arg in options]}
    if origin is typing.Literal:
        return {"enum": list(args)}
    if origin in (list, tuple, set, frozenset) or origin is typing.Sequence:
        items = args[0] if args else Any
        return {"type": "array", "items": _schema(items)}
    if origin is dict or origin is typing.Mapping:
        return {"type": "object", "additionalProperties": _schema(args[1]) if len(args) == 2 else {}}
    if isinstance(annotation, type):
        if issubclass(annotation, enum.Enum):
            return {"enum": [member.value for member in annotation]}
        if _pydantic is not None and issubclass(annotation, _pydantic.BaseModel):
            return annotation.model_json_schema()
        if dataclasses.is_dataclass(annotation):
            return _object_schema(annotation)
        if typing.is_typeddict(annotation):
            return _object_schema(annotation)
    return {}


def _object_schema(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    properties = {name: _schema(hint) for name, hint in hints.items()}
    if dataclasses.is_dataclass(cls):
        required = [
            f.name
            for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        ]
    else:
        required = sorted(getattr(cls, "__required_keys__", hints))
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    return schema


def _decode(value: Any, annotation: Any) -> Any:
    """A validated argument as the parameter's type: a pydantic model, a dataclass or an enum from its JSON."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _decode(value, typing.get_args(annotation)[0])
    if origin is typing.Union or origin is types.UnionType:
        options = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        return value if value is None or len(options) != 1 else _decode(value, options[0])
    if origin is list and isinstance(value, list):
        (item,) = typing.get_args(annotation) or (Any,)
        return [_decode(v, item) for v in value]
    if not isinstance(annotation, type):
        return value
    if _pydantic is not None and issubclass(annotation, _pydantic.BaseModel):
        return annotation.model_validate(value)
    if dataclasses.is_dataclass(annotation) and isinstance(value, dict):
        hints = typing.get_type_hints(annotation)
        return annotation(**{key: _decode(v, hints.get(key, Any)) for key, v in value.items()})
    if issubclass(annotation, enum.Enum):
        return annotation(value)
    if annotation is float and isinstance(value, int):
        return float(value)
    return value
