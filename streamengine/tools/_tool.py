"""``@tool``, :class:`Tool` and :class:`ToolRegistry`: a function the model may call, where it runs, what it returns.

Also the :class:`RemoteCall` that sends a tool to any ``concurrent.futures``
executor, the JSON text a result becomes, and tools named on a command line.

What a tool returned, as the text the model reads.

A value with an obvious JSON form becomes JSON; anything else is refused
with :class:`ToolReturnError` instead of being ``str()``-ed: ``repr`` of an
arbitrary object (``<Thing object at 0x7f...>``) or of a set is text the
model cannot use, and an ``ok`` result carrying it hides the bug from the
tool's author.

Running a tool on any ``concurrent.futures.Executor``: a process pool, a Dask cluster, ...

What crosses to the other side is a :class:`RemoteCall`: the tool *by
reference* (module and qualified name, as pickle sends functions), the
validated arguments and a :class:`ToolContext` whose deadline travels as
wall-clock time.  The other side imports the module and runs the tool there,
converting its return value to text before it comes back, so an odd return
value never has to be pickled.

"Started" for a remote call means handed over to the executor: its deadline
counts from then, and includes any time the call waits in the remote
executor's own queue.  A deadline or cancel calls ``Future.cancel()``, which
stops a call still queued remotely; one already running there runs on (no
executor can stop a Python function) and its result is discarded.  When the
executor runs the call in *this* process (a thread pool, Dask with
``processes=False``), the tool also sees the real cancel flag.

At most once: Dask re-runs the task of a worker that died on another worker
(the scheduler's ``allowed-failures``, 3 by default, which ``retries=`` does
not cover), so a side-effect tool could run four times.  On a Dask worker a
call therefore marks its start in a ``distributed.Event`` named by its
token, and a second start of the same call refuses with an error naming the
dead worker's fate instead of running the tool again.  The mark is cleared
when the tool returns (a finished call is never rescheduled).

``@tool``, :class:`Tool` and :class:`ToolRegistry`: a function the model may call.

Arguments are validated *before* the call: a model that invents or forgets
an argument gets an error result, and the function never runs on input it
did not declare.

Tools named on a command line or in a scenario file: ``module:attr`` or ``file.py:attr``.

Shared by the CLI's ``--tools`` and the scenario runner, so both accept the
same spellings and fail with the same one-line messages.
"""
from __future__ import annotations

import dataclasses
import datetime
import enum
import importlib
import importlib.util
import inspect
import itertools
import json
import os
import pickle
import sys
import threading
import uuid
import weakref
from dataclasses import dataclass
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Dict,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Tuple,
    Union,
    overload,
)

from .. import _validation as validation
from .._errors import ConfigError, ToolError
from .._messages import ToolContext, ToolSpec
from .._validation import one_line as _one_line
from .._validation import short_repr as _short
from ._schema import _NAME_RE, _GivenSchema, _Signature, describe_value, parse_docstring

if TYPE_CHECKING:
    import concurrent.futures


_WHAT_TO_RETURN = "return str, a JSON value (dict/list/number/bool/None), a dataclass or a pydantic model"


class ToolFailure(ToolError):
    """A tool's failure already worded for the model (an MCP server's error): the result is its message as is."""


class ToolReturnError(ToolFailure):
    """A tool returned a value that has no JSON form; the message says what to return instead."""


class _NoJsonForm(TypeError):
    """Internal: a value with no JSON form, met deep inside a result; never escapes ``result_to_text``."""

    def __init__(self, value: Any) -> None:
        super().__init__(type(value).__name__)
        self.value = value


def result_to_text(value: Any, tool_name: str = "?") -> str:
    """str as is, None as "", UTF-8 bytes decoded; JSON values, dataclasses and pydantic models as JSON.

    Inside those, ``datetime``/``date``/``time`` become ISO strings and
    ``Enum`` members their values (what ``model_dump(mode="json")`` does too).
    Raises :class:`ToolReturnError` naming the offending type otherwise.
    """
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ToolReturnError(f"tool '{tool_name}' returned bytes that are not UTF-8 text ({exc.reason} at "
                                  f"byte {exc.start}); decode them, or {_WHAT_TO_RETURN}") from exc
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False, default=_json_form)
    except _NoJsonForm as exc:
        inside = "" if exc.value is value else f"{_a(type(value).__name__)} containing "
        raise ToolReturnError(f"tool '{tool_name}' returned {inside}{_a(type(exc.value).__name__)}; "
                              f"{_WHAT_TO_RETURN}") from exc
    except (TypeError, ValueError) as exc:  # NaN/inf, cycles, dict keys that are not str/int/float/bool
        raise ToolReturnError(f"tool '{tool_name}' returned {_a(type(value).__name__)} that is not valid "
                              f"JSON ({exc}); {_WHAT_TO_RETURN}") from exc


def _json_form(value: Any) -> Any:
    """``json.dumps``'s ``default``: the JSON form of the few non-JSON types with an obvious one."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    pydantic = sys.modules.get("pydantic")  # a pydantic model implies pydantic is imported
    if pydantic is not None and isinstance(value, pydantic.BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, enum.Enum):
        return value.value
    raise _NoJsonForm(value)


def _a(noun: str) -> str:
    return f"an {noun}" if noun[:1].lower() in "aeiou" else f"a {noun}"


_tokens = itertools.count(1)
_events: weakref.WeakValueDictionary[str, threading.Event] = weakref.WeakValueDictionary()
_resolved: Dict[Tuple[str, str, str], Any] = {}
_resolved_lock = threading.Lock()


def remote_reference(fn: Callable[..., Any], name: str) -> Tuple[str, str]:
    """``(module, qualname)`` another process can import ``fn`` by; :class:`ToolError` if there is none."""
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    why = None
    if inspect.ismethod(fn):
        why = "it is a bound method (its object would have to travel with it)"
    elif not module or not qualname:
        why = "it has no module-level name"
    elif "<lambda>" in qualname:
        why = "it is a lambda"
    elif "<locals>" in qualname:
        why = "it is defined inside another function (a closure or nested function)"
    if why is not None:
        raise ToolError(f"tool {name!r} asks for executor='remote', but it cannot be sent to another process: "
                        f"{why}; define it with def at the top level of an importable module")
    return module, qualname  # type: ignore[return-value]


def share_cancel_event(event: threading.Event) -> str:
    """A token by which a call that runs in *this* process finds the real cancel flag."""
    # Unique across the processes and machines that share one cluster (the pid alone is not).
    token = f"{os.getpid()}-{next(_tokens)}-{uuid.uuid4().hex}"
    _events[token] = event
    return token


@dataclass(frozen=True)
class RemoteCall:
    """A picklable, argument-less callable: ``executor.submit(call)`` runs one tool call anywhere."""

    module: str
    qualname: str
    tool_name: str
    args: Dict[str, Any]
    context: ToolContext
    token: str

    def __call__(self) -> str:
        tool = _resolve(self.module, self.qualname, self.tool_name)
        context = self.context
        pid, _, _ = self.token.partition("-")
        event = _events.get(self.token) if pid == str(os.getpid()) else None
        if event is not None:  # same process: the tool can see the cancel flag
            context = ToolContext(event, context.deadline)
        started = _mark_started_on_dask(self.token, self.tool_name)
        try:
            text: str = tool._invoke(dict(self.args), context)
            return text
        except Exception as exc:
            raise _sendable(exc) from None
        finally:
            if started is not None:
                started.clear()


def _mark_started_on_dask(token: str, tool_name: str) -> Any:
    """On a Dask worker: mark the call started cluster-wide (the mark, to clear), or refuse a second start.

    Elsewhere (a process pool, which never re-runs a call) there is nothing to mark: None.
    """
    try:
        from distributed import Event, get_worker
        worker = get_worker()
    except (ImportError, ValueError):
        return None
    mark: Any = Event(f"streamengine-call-{token}")  # type: ignore[no-untyped-call, unused-ignore]
    if mark.is_set():
        raise RemoteToolError(
            f"tool {tool_name!r} was already started on a Dask worker that died (or was lost) while running it, "
            f"and the scheduler rescheduled it onto {worker.address}; it is not run a second time, since remote "
            f"tools run at most once: check the dead worker's log, then call it again only if it has no side "
            f"effects that may already have happened")
    mark.set()
    return mark


class RemoteToolError(ToolError):
    """A remote tool's exception that could not travel back as itself; its text says what it was."""


def _sendable(exc: Exception) -> Exception:
    """``exc`` if it survives a pickle round trip, else a stand-in carrying ``Type: message``.

    An exception whose ``__init__`` takes other arguments than its ``args``
    fails to unpickle in the caller, and a ``ProcessPoolExecutor`` that meets
    one is broken for every later call of every run.
    """
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RemoteToolError(f"{type(exc).__name__}: {exc}")


def _resolve(module: str, qualname: str, tool_name: str) -> Any:
    key = (module, qualname, tool_name)
    with _resolved_lock:
        found = _resolved.get(key)
    if found is not None:
        return found
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    tool = obj if isinstance(obj, Tool) and obj.name == tool_name else Tool(getattr(obj, "fn", obj), name=tool_name)
    with _resolved_lock:
        _resolved[key] = tool
    return tool


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
        copy: Dict[str, Any] = json.loads(json.dumps(self._schema))
        return copy

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
        checked: Dict[str, Any]
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


@overload
def tool(fn: Callable[..., Any], *, name: Optional[str] = None, description: Optional[str] = None,
         timeout: Optional[float] = None, side_effects: bool = False, executor: str = "local") -> Tool: ...


@overload
def tool(fn: Optional[str] = None, *, name: Optional[str] = None, description: Optional[str] = None,
         timeout: Optional[float] = None, side_effects: bool = False,
         executor: str = "local") -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Union[Callable[..., Any], str, None] = None,
    *,
    name: Optional[str] = None,
    description: Optional[str] = None,
    timeout: Optional[float] = None,
    side_effects: bool = False,
    executor: str = "local",
) -> Union[Tool, Callable[[Callable[..., Any]], Tool]]:
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


_FORMS = "expected 'module:attribute' (e.g. 'myapp.tools:TOOLS') or 'path/to/file.py:attribute' (e.g. 'tools.py:TOOLS')"


def import_object(spec: str, what: str = "--tools") -> Any:
    """``"package.module:attr.sub"`` or ``"path/to/file.py:attr"`` -> the object, or a one-line :class:`ConfigError`.

    The current directory is put on ``sys.path`` (as gunicorn and uvicorn do),
    so ``--tools mytools:TOOLS`` finds ``./mytools.py`` from the console script.
    A ``.py`` path is imported from that file, with its directory on
    ``sys.path`` so that its own imports of neighbouring modules work.
    """
    source, sep, attr = str(spec).rpartition(":")  # rpartition: a Windows path has a ':' of its own
    if not sep or not source.strip() or not attr.strip() or not _is_dotted(attr):
        raise ConfigError(f"{what} {spec!r}: {_FORMS}")
    if source.endswith(".py") or "/" in source or os.sep in source:
        obj, label = _import_file(spec, source, what), source
    elif _is_dotted(source):
        obj, label = _import_module(spec, source, what), source
    else:
        raise ConfigError(f"{what} {spec!r}: {source!r} is neither a module name nor a .py file; {_FORMS}")
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            raise ConfigError(f"{what} {spec!r}: {label!r} has no attribute {attr!r}") from exc
    return obj


def _is_dotted(name: str) -> bool:
    return all(part.isidentifier() for part in name.split("."))


def _import_module(spec: str, module_name: str, what: str) -> Any:
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(module_name)
    except Exception as exc:  # anything the module raises while importing
        raise ConfigError(f"{what} {spec!r}: cannot import module {module_name!r}: "
                          f"{type(exc).__name__}: {_one_line(str(exc))}") from exc


def _import_file(spec: str, source: str, what: str) -> Any:
    path = os.path.abspath(source)
    if not source.endswith(".py"):
        raise ConfigError(f"{what} {spec!r}: {source!r} looks like a path but does not end in .py; {_FORMS}")
    if not os.path.isfile(path):
        raise ConfigError(f"{what} {spec!r}: no such file {path!r}")
    stem = os.path.splitext(os.path.basename(path))[0]
    existing = sys.modules.get(stem)
    if existing is not None and os.path.abspath(getattr(existing, "__file__", "") or "") == path:
        return existing  # loaded before (by path or as a module): one module object, not two
    # Under its own name when that is free, so classes in it pickle by reference like any module's.
    name = stem if stem.isidentifier() and existing is None else f"_streamengine_file_{abs(hash(path)):x}"
    folder = os.path.dirname(path)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise ConfigError(f"{what} {spec!r}: cannot load {path!r} as a Python module")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # dataclasses and pickling look the module up while it runs
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:  # anything the file raises while running
        sys.modules.pop(name, None)
        raise ConfigError(f"{what} {spec!r}: cannot import {path!r}: "
                          f"{type(exc).__name__}: {_one_line(str(exc))}") from exc
    return module


def load_tools(spec: str, what: str = "--tools") -> List[Tool]:
    """The tools named by ``module:attr`` or ``file.py:attr``: a Tool, a function, or a list/tuple/registry of them.

    A bare ``file.py`` offers every ``@tool`` the file defines (as ``llm --functions`` takes a file's
    functions); tools it only imports from elsewhere are not offered.
    """
    if spec.endswith(".py") and not _is_dotted(spec.rpartition(":")[2]):
        return _tools_defined_in(_import_file(spec, spec, what), spec, what)
    obj = import_object(spec, what)
    items = list(obj) if isinstance(obj, (list, tuple, ToolRegistry)) else [obj]
    tools = []
    for item in items:
        if not callable(item):
            raise ConfigError(f"{what} {spec!r}: {type(item).__name__} {_short(item)} is not a tool or a function; "
                              "point at a @tool function or a list of them")
        try:
            tools.append(Tool.from_function(item))
        except ToolError as exc:
            raise ConfigError(f"{what} {spec!r}: {_one_line(str(exc))}") from exc
    return tools


def _tools_defined_in(module: Any, spec: str, what: str) -> List[Tool]:
    """The ``@tool`` objects whose function the file itself defines, in the file's order."""
    tools = [value for value in vars(module).values()
             if isinstance(value, Tool) and getattr(value.fn, "__module__", None) == module.__name__]
    if not tools:
        raise ConfigError(f"{what} {spec!r}: the file defines no @tool; decorate its functions with @tool, "
                          "or name one with 'file.py:function'")
    return tools
