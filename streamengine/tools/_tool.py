"""``@tool``, :class:`Tool` and :class:`ToolRegistry`: a function the model may call.

Arguments are validated *before* the call: a model that invents or forgets
an argument gets an error result, and the function never runs on input it
did not declare.
"""
from __future__ import annotations

import inspect
import json
import threading
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Tuple

from .. import _validation as validation
from .._errors import ConfigError, ToolError
from .._messages import ToolSpec
from .._tool_context import ToolContext
from ._docstrings import parse_docstring
from ._jsonschema import describe_value
from ._remote import remote_reference
from ._results import result_to_text
from ._schema import _NAME_RE, _GivenSchema, _Signature

if TYPE_CHECKING:
    import concurrent.futures


class Tool:
    """A function the model may call; calling the ``Tool`` itself calls the function.

    Immutable after construction: its schema is shared by the spec the model
    sees and the validator that guards the function.

    ``parameters`` (a JSON schema) replaces the one read from the signature:
    for a tool whose arguments are declared elsewhere (an MCP server's), sent
    to the model unchanged and validated by that owner, not here.
    """

    #: A tool that starts its call itself and answers with a future (an MCP tool: the call
    #: runs on an event loop) sets this and overrides :meth:`start`; the executor then holds
    #: no worker thread while the call runs.
    starts_itself: bool = False
    #: How to rename this tool when two share a name (the registry's error says it).
    rename_hint: str = "@tool(name='...')"

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: Optional[str] = None,
        description: Optional[str] = None,
        timeout: Optional[float] = None,
        side_effects: bool = False,
        executor: str = "local",
        parameters: Optional[Mapping[str, Any]] = None,
    ) -> None:
        if not callable(fn):
            raise ToolError(f"a tool must wrap a function, got {type(fn).__name__}")
        name = name if name is not None else getattr(fn, "__name__", "")
        _check_name(name)
        timeout = _check_timeout(timeout, f"tool {name!r}")
        remote_ref = _check_placement(fn, name, executor)
        summary, param_docs = parse_docstring(inspect.getdoc(fn))
        signature = _Signature(fn, name, param_docs) if parameters is None else _GivenSchema(parameters)
        # The attributes, declared here rather than in the class body: any annotation there
        # gives Tool a class ``__annotations__`` that instances would show in place of the
        # wrapped function's (typing.get_type_hints(tool) would then read Tool's own hints).
        self.fn: Callable[..., Any]
        self.name: str
        self.description: str
        self.timeout: Optional[float]
        self.side_effects: bool
        self.executor: str
        self.remote_ref: Optional[Tuple[str, str]]
        self._schema: Dict[str, Any]
        self._signature: Any  # _Signature, or _GivenSchema for ``parameters=``
        self._context_param: Optional[str]
        self._spec: ToolSpec
        set_ = object.__setattr__  # __setattr__ refuses assignment: Tool is immutable
        set_(self, "fn", fn)
        set_(self, "name", name)
        set_(self, "description", description if description is not None else summary)
        set_(self, "timeout", timeout)
        set_(self, "side_effects", bool(side_effects))
        set_(self, "executor", executor)
        set_(self, "remote_ref", remote_ref)
        set_(self, "_schema", signature.schema)
        set_(self, "_signature", signature)
        set_(self, "_context_param", signature.context_param)
        set_(self, "_spec", ToolSpec(name, self.description, json.loads(json.dumps(self._schema))))
        set_(self, "__wrapped__", fn)
        set_(self, "__doc__", getattr(fn, "__doc__", None))
        set_(self, "__name__", getattr(fn, "__name__", name))
        set_(self, "__qualname__", getattr(fn, "__qualname__", name))
        set_(self, "__module__", getattr(fn, "__module__", None))

    @classmethod
    def from_function(
        cls,
        fn: Callable[..., Any],
        *,
        name: Optional[str] = None,
        description: Optional[str] = None,
        timeout: Optional[float] = None,
        side_effects: bool = False,
        executor: str = "local",
    ) -> Tool:
        """Wrap ``fn``; a ``Tool`` given without options is returned as is."""
        if isinstance(fn, Tool):
            if name is None and description is None and timeout is None and not side_effects \
                    and executor == "local":
                return fn
            if fn.starts_itself:
                raise ToolError(f"tool {fn.name!r} is not a Python function; set its options where it is made "
                                "(for an MCP tool: McpServer.tools(prefix=..., timeout=...))")
            fn = fn.fn
        return cls(fn, name=name, description=description, timeout=timeout, side_effects=side_effects,
                   executor=executor)

    def __setattr__(self, key: str, value: Any) -> None:
        raise AttributeError(f"Tool {self.name!r} is immutable; build a new one with tool(fn, {key}=...)")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return (f"Tool(name={self.name!r}, timeout={self.timeout!r}, side_effects={self.side_effects!r}, "
                f"executor={self.executor!r})")

    @property
    def spec(self) -> ToolSpec:
        """Name, description and JSON schema, as sent to the model."""
        return self._spec

    @property
    def parameters(self) -> Dict[str, Any]:
        """A copy of the JSON schema of the arguments."""
        return json.loads(json.dumps(self._schema))

    @property
    def context_param(self) -> Optional[str]:
        """The parameter that receives the :class:`ToolContext`, if any."""
        return self._context_param

    def validate(self, args: Any) -> Dict[str, Any]:
        """Return the checked arguments, or raise :class:`ToolError` naming every problem.

        A null for an argument that has a default means "use the default"
        (models often send it for options they do not want to set).
        """
        if not isinstance(args, Mapping):
            raise ToolError(f"arguments for tool {self.name!r} must be a JSON object, got {describe_value(args)}")
        checked, problems = self._signature.check(args)
        if problems:
            raise ToolError(f"invalid arguments for tool {self.name!r}: " + "; ".join(problems))
        return checked

    def run(self, args: Mapping[str, Any], context: Optional[ToolContext] = None) -> str:
        """Validate ``args``, call the function, and return its value as text."""
        return self._invoke(self.validate(args), context)

    def start(self, checked: Dict[str, Any], context: ToolContext) -> concurrent.futures.Future[str]:
        """Start the call and return its future (only for ``starts_itself`` tools).

        Cancelling the future must stop the call; the executor does so at the
        deadline or on cancel.
        """
        raise NotImplementedError(f"tool {self.name!r} runs on a worker thread; it has no start()")

    def _invoke(self, checked: Dict[str, Any], context: Optional[ToolContext]) -> str:
        kwargs = dict(checked)
        if self._context_param is not None:
            kwargs[self._context_param] = context if context is not None else ToolContext()
        return result_to_text(self.fn(**kwargs), self.name)


def _check_name(name: Any) -> None:
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise ToolError(
            f"tool name {name!r} is invalid: use 1-64 characters from A-Z, a-z, 0-9, '_', '.', '-' "
            "(pass name='...' to @tool for lambdas and callables without a usable __name__)"
        )


def _check_placement(fn: Callable[..., Any], name: str, executor: Any) -> Optional[Tuple[str, str]]:
    if executor == "local":
        return None
    if executor != "remote":
        raise ToolError(f"executor of tool {name!r} must be 'local' or 'remote', got {executor!r}")
    return remote_reference(fn, name)


def _check_timeout(timeout: Any, label: str) -> Optional[float]:
    """The project's one rule for seconds, told as a :class:`ToolError` (it is the tool's definition that is wrong)."""
    try:
        return validation.seconds(timeout, f"timeout of {label}", allow_none=True)
    except ConfigError as exc:
        raise ToolError(str(exc)) from exc


def tool(
    fn: Any = None,
    *,
    name: Optional[str] = None,
    description: Optional[str] = None,
    timeout: Optional[float] = None,
    side_effects: bool = False,
    executor: str = "local",
) -> Any:
    """Make a :class:`Tool`: ``@tool``, ``@tool()``, ``@tool("name")`` or ``@tool(name=..., ...)``.

    ``side_effects=True`` tells the engine not to start the tool before the
    model's stream finished normally (no half-confirmed writes).
    ``executor="remote"`` runs it on the remote executor given to
    :class:`ToolExecutor` (a process pool, a Dask cluster); it must then be a
    top-level function another process can import.
    """
    if isinstance(fn, str):
        if name is not None:
            raise ToolError(f"tool name given twice ({fn!r} and name={name!r}); pass it once")
        name, fn = fn, None

    def make(f: Any) -> Tool:
        return Tool.from_function(f, name=name, description=description, timeout=timeout,
                                  side_effects=side_effects, executor=executor)

    if fn is None:
        return make
    return make(fn)


# --------------------------------------------------------------------------- registry


class ToolRegistry:
    """The tools one engine offers, by name, in registration order."""

    def __init__(self, tools: Iterable[Any] = ()) -> None:
        self._tools: Dict[str, Tool] = {}
        self._lock = threading.Lock()
        for item in tools:
            self.register(item)

    def register(self, item: Any) -> Tool:
        """Add a :class:`Tool` or plain function; a second tool with the same name is refused."""
        made = Tool.from_function(item)
        with self._lock:
            if made.name in self._tools:
                hints = dict.fromkeys([self._tools[made.name].rename_hint, made.rename_hint])
                raise ToolError(f"two tools are named {made.name!r}; give one of them another name with "
                                + " or ".join(hints))
            tools = dict(self._tools)
            tools[made.name] = made
            self._tools = tools  # copy-on-write: readers need no lock
        return made

    def get(self, name: str) -> Optional[Tool]:
        return self._tools.get(name)

    @property
    def names(self) -> Tuple[str, ...]:
        return tuple(self._tools)

    def specs(self) -> List[ToolSpec]:
        return [t.spec for t in self._tools.values()]

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(list(self._tools.values()))

    def __len__(self) -> int:
        return len(self._tools)

    def __repr__(self) -> str:
        return f"ToolRegistry({list(self._tools)!r})"


