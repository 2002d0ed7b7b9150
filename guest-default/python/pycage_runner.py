"""The guest side of one pycage run, independent of the transport.

Everything here runs inside the sandbox, on untrusted code, and is itself untrusted from the
host's point of view: the host enforces every policy (allowlist, call ceiling, byte caps,
limits). This module only gives the code a pleasant shape:

* the code is compiled with top-level ``await`` and a top-level ``return`` allowed; line numbers
  in tracebacks are the user's own;
* each exposed tool is an ``async`` function in the code's globals (under its bare name when no
  other tool shares it, and as an attribute of its namespace: ``await math.add(...)``), and
  ``call_tool(name, **kwargs)`` calls any tool synchronously; a refused or failed call raises
  ``ToolError``;
* the return value crosses back as JSON, converted by the rule in ``to_json_value``.

A transport (the wasm component, or a socket for the OS backends) supplies one function,
``call(name, args_json) -> (ok, payload)``: on success ``payload`` is the result's JSON text, on
failure it is ``(kind, message)``.
"""

import ast
import asyncio
import asyncio.base_events
import asyncio.events
import builtins
import json
import linecache
import math
import sys
import time
import traceback

FILENAME = "<code>"
MAIN = "__pycage_main__"
STAR_IMPORT = "__pycage_import_star__"
MAX_MESSAGE_CHARS = 2000
MAX_TRACEBACK_CHARS = 16000
MAX_VALUE_DEPTH = 200

# Failure kinds; they match the `failure-kind` enum of the WIT contract.
SYNTAX_ERROR = "syntax-error"
GUEST_EXCEPTION = "guest-exception"
INVALID_INPUT = "invalid-input"
VALUE_TOO_LARGE = "value-too-large"


class ToolError(Exception):
    """A tool call was refused by the host's broker or the tool failed.

    ``kind`` is one of ``not-found``, ``invalid-arguments``, ``denied``, ``failed``,
    ``limit-exceeded``; the message is the broker's short text.
    """

    def __init__(self, kind, message):
        super().__init__(message)
        self.kind = kind


# It lives in the code's globals like a builtin; tracebacks say `ToolError`, not the module.
ToolError.__module__ = "builtins"


class Failure(Exception):
    """A run that ends without a value: carries the kind, message and traceback."""

    def __init__(self, kind, message, tb=None, exception=None):
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.traceback = tb
        self.exception = exception


# --------------------------------------------------------------------------------------------
# An event loop without I/O.
#
# WASI has no socketpair, so asyncio's selector loop cannot start. The guest has no sockets or
# pipes to watch anyway: all it can wait for is time. This loop keeps asyncio's scheduling
# (tasks, futures, call_later, sleep, gather, queues) and waits for timers by sleeping.


class _TimeOnlySelector:
    def select(self, timeout=None):
        if timeout is None:
            # Nothing is scheduled and nothing can wake us: the program is stuck. Raising beats
            # sleeping until the host's wall clock ends the run.
            raise RuntimeError("deadlock: every task is waiting and nothing can wake one up")
        if timeout > 0:
            time.sleep(timeout)
        return []

    def close(self):
        pass


class GuestEventLoop(asyncio.base_events.BaseEventLoop):
    """An asyncio loop for a sandbox with no file descriptors to watch."""

    def __init__(self):
        super().__init__()
        self._selector = _TimeOnlySelector()

    def _process_events(self, event_list):
        pass

    def _write_to_self(self):
        pass

    def close(self):
        super().close()


def install_event_loop():
    """Makes ``asyncio.run`` and ``asyncio.new_event_loop`` use ``GuestEventLoop``."""
    policy = asyncio.events._get_event_loop_policy()
    policy._loop_factory = GuestEventLoop


# --------------------------------------------------------------------------------------------
# Compiling the code.


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
# `type X = ...` exists from Python 3.12; on older interpreters (the OS backends' native
# CPython) no node can be an instance of the empty tuple.
_TYPE_ALIAS = (ast.TypeAlias,) if hasattr(ast, "TypeAlias") else ()


def _enclosing_parts(node):
    """What a nested scope's definition evaluates in the enclosing scope."""
    parts = list(getattr(node, "decorator_list", ()))
    parts.extend(getattr(node, "bases", ()))
    parts.extend(k.value for k in getattr(node, "keywords", ()))
    args = getattr(node, "args", None)
    if args is not None:
        parts.extend(args.defaults)
        parts.extend(d for d in args.kw_defaults if d is not None)
    return parts


def _scan_top_level(body):
    """The names the code's top level binds, whether it awaits, and a top-level ``yield``.

    It walks the module's own scope only, with an explicit stack (deeply nested expressions
    must not exhaust Python's recursion limit here): bodies of functions, lambdas and classes
    are skipped, but what the enclosing scope evaluates (decorators, defaults, bases) is
    visited. A walrus inside a comprehension binds in the enclosing scope, so it counts too;
    an ``async`` comprehension awaits in the enclosing scope.
    """
    names = set()
    awaits = False
    yield_node = None
    stack = list(body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Name):
            if isinstance(node.ctx, (ast.Store, ast.Del)):
                names.add(node.id)
            continue
        if isinstance(node, _SCOPES):
            if not isinstance(node, ast.Lambda):
                names.add(node.name)
            stack.extend(_enclosing_parts(node))
            continue
        if isinstance(node, _COMPREHENSIONS):
            awaits = awaits or any(g.is_async for g in node.generators)
            for child in ast.walk(node):
                if isinstance(child, ast.NamedExpr) and isinstance(child.target, ast.Name):
                    names.add(child.target.id)
                elif isinstance(child, ast.Await):
                    awaits = True
            continue
        if isinstance(node, (ast.Await, ast.AsyncFor, ast.AsyncWith)):
            awaits = True
        elif isinstance(node, (ast.Yield, ast.YieldFrom)):
            if yield_node is None or node.lineno < yield_node.lineno:
                yield_node = node
        elif isinstance(node, ast.Import):
            names.update(a.asname or a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.update(a.asname or a.name for a in node.names if a.name != "*")
        elif isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)):
            if node.name:
                names.add(node.name)
        elif isinstance(node, ast.MatchMapping):
            if node.rest:
                names.add(node.rest)
        elif isinstance(node, _TYPE_ALIAS):
            names.add(node.name.id)
            continue
        stack.extend(ast.iter_child_nodes(node))
    return names, awaits, yield_node


def _rewrite_statements(body):
    """Rewrites top-level statements that cannot live inside a function, in place.

    ``from m import *`` becomes a call that copies the module's public names into the
    globals; a module-level ``global`` statement (a no-op there) is dropped. Only statement
    lists are walked (compound statements nest at most ~100 deep), never expressions.
    """
    pending = [body]
    while pending:
        stmts = pending.pop()
        i = 0
        while i < len(stmts):
            node = stmts[i]
            if isinstance(node, ast.Global):
                del stmts[i]
                continue
            if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
                call = ast.Call(
                    func=ast.Name(id=STAR_IMPORT, ctx=ast.Load()),
                    args=[ast.Constant(node.module or ""), ast.Constant(node.level)],
                    keywords=[],
                )
                stmts[i] = _located(ast.Expr(value=call), node)
            elif not isinstance(node, _SCOPES):
                for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                    inner = getattr(node, field, None)
                    if isinstance(inner, list):
                        if field in ("handlers", "cases"):
                            pending.extend(h.body for h in inner)
                        else:
                            pending.append(inner)
            i += 1


def _located(node, like):
    """Gives ``node`` and its children ``like``'s position (no recursion into user nodes)."""
    for child in ast.walk(node):
        child.lineno = like.lineno
        child.col_offset = like.col_offset
        child.end_lineno = like.end_lineno
        child.end_col_offset = like.end_col_offset
    return node


def _syntax_failure(exc):
    lines = traceback.format_exception_only(type(exc), exc)
    message = _one_line(lines[-1] if lines else repr(exc))
    if exc.lineno is not None:
        message = f"{message} (line {exc.lineno})"
    return Failure(SYNTAX_ERROR, message, _cap("".join(lines), MAX_TRACEBACK_CHARS))


_TOP_LEVEL_AWAIT = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
_CO_COROUTINE = 0x0080
_TOP_LEVEL_RETURN = "'return' outside function"


def compile_code(code):
    """Compiles the code; returns ``(code_object, is_async, wrapped)``.

    Code without a top-level ``return`` compiles as a module with top-level ``await``
    allowed: exactly a script's semantics, at the cost of one ``compile``. Code with a
    top-level ``return`` becomes the body of a main function (see ``compile_wrapped``).
    """
    try:
        compiled = compile(code, FILENAME, "exec", flags=_TOP_LEVEL_AWAIT, dont_inherit=True)
    except SyntaxError as exc:
        if exc.msg != _TOP_LEVEL_RETURN:
            raise _syntax_failure(exc) from None
    except ValueError as exc:
        raise Failure(SYNTAX_ERROR, _one_line(f"ValueError: {exc}")) from None
    except (MemoryError, RecursionError) as exc:
        raise Failure(SYNTAX_ERROR, f"{type(exc).__name__}: the code is nested too deeply") from None
    else:
        return compiled, bool(compiled.co_flags & _CO_COROUTINE), False
    compiled, is_async = compile_wrapped(code)
    return compiled, is_async, True


def compile_wrapped(code):
    """Compiles the code into a module whose one statement defines the main function.

    The main function's body is the user's code; every name its top level binds is declared
    ``global``, so top-level variables, functions and classes live in the globals exactly as in
    a script. It is ``async def`` only when the top level awaits, so code that calls
    ``asyncio.run()`` itself works. Returns ``(code_object, is_async)``.
    """
    try:
        tree = ast.parse(code, filename=FILENAME, mode="exec")
    except (SyntaxError, ValueError) as exc:
        if isinstance(exc, SyntaxError):
            raise _syntax_failure(exc) from None
        raise Failure(SYNTAX_ERROR, _one_line(f"ValueError: {exc}")) from None
    except (MemoryError, RecursionError) as exc:
        raise Failure(SYNTAX_ERROR, f"{type(exc).__name__}: the code is nested too deeply") from None

    future = [n for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "__future__"]
    body = [n for n in tree.body if n not in future]
    _rewrite_statements(body)

    names, is_async, yield_node = _scan_top_level(body)
    if yield_node is not None:
        error = SyntaxError("'yield' outside function")
        error.lineno = yield_node.lineno
        error.offset = yield_node.col_offset + 1
        error.filename = FILENAME
        error.text = _source_line(code, error.lineno)
        raise _syntax_failure(error)

    if names:
        body.insert(0, ast.Global(names=sorted(names), lineno=1, col_offset=0, end_lineno=1, end_col_offset=0))
    if not body:
        body = [ast.Pass(lineno=1, col_offset=0, end_lineno=1, end_col_offset=0)]

    cls = ast.AsyncFunctionDef if is_async else ast.FunctionDef
    # `type_params` is a field from Python 3.12 on.
    extra = {"type_params": []} if "type_params" in cls._fields else {}
    main = cls(
        name=MAIN,
        args=ast.arguments(
            posonlyargs=[], args=[], vararg=None, kwonlyargs=[], kw_defaults=[], kwarg=None,
            defaults=[],
        ),
        body=body,
        decorator_list=[],
        returns=None,
        lineno=1,
        col_offset=0,
        end_lineno=1,
        end_col_offset=0,
        **extra,
    )
    module = ast.Module(body=future + [main], type_ignores=[])
    try:
        compiled = compile(module, FILENAME, "exec", dont_inherit=True)
    except SyntaxError as exc:
        if exc.text is None and exc.lineno is not None:
            exc.text = _source_line(code, exc.lineno)
        raise _syntax_failure(exc) from None
    except (MemoryError, RecursionError) as exc:
        raise Failure(SYNTAX_ERROR, f"{type(exc).__name__}: the code is nested too deeply") from None
    return compiled, is_async


def _source_line(code, lineno):
    lines = code.splitlines()
    if 1 <= lineno <= len(lines):
        return lines[lineno - 1]
    return None


# --------------------------------------------------------------------------------------------
# The code's globals.


def _import_star(module, level):
    if level:
        raise ImportError("relative imports are not available in the sandbox")
    mod = __import__(module, fromlist=["*"])
    names = getattr(mod, "__all__", None)
    if names is None:
        names = [n for n in dir(mod) if not n.startswith("_")]
    g = sys._getframe(1).f_globals
    for name in names:
        g[name] = getattr(mod, name)


class ToolNamespace:
    """The tools of one namespace as attributes: ``await fs.read_file(path=...)``."""

    def __init__(self, name):
        self._name = name

    def __repr__(self):
        names = ", ".join(sorted(k for k in vars(self) if not k.startswith("_")))
        return f"<tools {self._name}: {names}>"


def _make_tool_function(call, binding, qualified, description):
    async def tool(**kwargs):
        return invoke_tool(call, qualified, kwargs)

    tool.__name__ = binding
    tool.__qualname__ = binding
    tool.__doc__ = description
    return tool


# The host's HTTP tool: its functions take the URL by position too, as `fetch(url)` reads.
FETCH_TOOL = "net.fetch"


def _fetch_functions(call, description):
    """``await fetch(url, ...)`` and ``fetch_sync(url, ...)``, both ``net.fetch``."""

    def arguments(url, kwargs):
        if url is not None:
            if "url" in kwargs:
                raise TypeError("fetch() got the URL twice")
            kwargs["url"] = url
        return kwargs

    async def fetch(url=None, **kwargs):
        return invoke_tool(call, FETCH_TOOL, arguments(url, kwargs))

    def fetch_sync(url=None, **kwargs):
        return invoke_tool(call, FETCH_TOOL, arguments(url, kwargs))

    for function in (fetch, fetch_sync):
        function.__doc__ = description
    return fetch, fetch_sync


# One encoder and one decoder for every call. `JSONEncoder.encode` builds a new C encoder (nine
# arguments parsed) and two closures on every call: 7 µs of a 17 µs tool call in the wasm
# guest, where calling one C encoder built once takes 2.8 µs. This one keeps no `markers`
# (a dict shared between calls, which a call that fails part-way would leave stale), so a
# circular structure ends in RecursionError rather than ValueError; callers take both.
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))
_C_ENCODER = (
    json.encoder.c_make_encoder(
        None, _ENCODER.default, json.encoder.encode_basestring, None, ":", ",", False, False, False
    )
    if json.encoder.c_make_encoder is not None
    else None
)
_SCAN = json.JSONDecoder().scan_once


def to_json_text(value):
    """Compact JSON text that is valid UTF-8: lone surrogates become U+FFFD."""
    if _C_ENCODER is None:
        text = _ENCODER.encode(value)
    elif isinstance(value, str):
        text = json.encoder.encode_basestring(value)
    else:
        text = "".join(_C_ENCODER(value, 0))
    if text.isascii():  # a flag CPython keeps on every string: no scan
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


def invoke_tool(call, name, kwargs):
    """Calls a tool through the transport; returns the decoded result or raises ToolError."""
    try:
        args_json = to_json_text(kwargs)
    except (TypeError, ValueError, RecursionError) as exc:
        if isinstance(exc, RecursionError):
            exc = "nested too deeply (or circular)"
        raise ToolError("invalid-arguments", f"arguments are not JSON: {exc}") from None
    ok, payload = call(name, args_json)
    if not ok:
        kind, message = payload
        raise ToolError(kind, message)
    # The host sends compact JSON it produced itself; the scanner reads it without the
    # Python layers of `json.loads`.
    try:
        return _SCAN(payload, 0)[0]
    except StopIteration:
        raise ToolError("failed", "the tool result is not JSON") from None


# The tool transport of the run going on, for library code that reaches tools on the code's
# behalf (``urllib.request`` through ``net.fetch``); a list so that setting it does not grow
# this module's dict after the snapshot.
CURRENT_CALL = [None]


def make_globals(call, tools, variables):
    """The globals the code runs in: builtins, initial variables, tools and ``call_tool``."""
    CURRENT_CALL[0] = call
    g = {"__name__": "__main__", "__builtins__": builtins, "__doc__": None}
    g.update(variables)

    def call_tool(name, **kwargs):
        """Calls the tool ``name`` (bare or ``namespace.name``) synchronously."""
        if not isinstance(name, str):
            raise TypeError("call_tool() name must be a string")
        return invoke_tool(call, name, kwargs)

    g["call_tool"] = call_tool
    g["ToolError"] = ToolError
    spaces = {}
    for binding, qualified, description in tools:
        namespace, _, name = qualified.partition(".")
        if qualified == FETCH_TOOL:
            function, fetch_sync = _fetch_functions(call, description)
            if "fetch_sync" not in g:
                g["fetch_sync"] = fetch_sync
        else:
            function = _make_tool_function(call, binding or name, qualified, description)
        if binding:
            g[binding] = function
        if namespace not in spaces:
            spaces[namespace] = ToolNamespace(namespace)
        setattr(spaces[namespace], name, function)
    # A variable, a bare tool name or a built-in keeps its name; the namespace then stays
    # reachable through `call_tool("namespace.name")`.
    for namespace, space in spaces.items():
        if namespace not in g and not hasattr(builtins, namespace):
            g[namespace] = space
    g[STAR_IMPORT] = _import_star
    return g


# --------------------------------------------------------------------------------------------
# The return value.


def to_json_value(value, depth=0, path=None):
    """Converts a return value to something ``json.dumps`` accepts.

    The rule: ``None``, ``bool``, ``int``, ``str``, finite ``float``, ``list`` and ``dict`` pass
    as they are; tuples become arrays; sets and frozensets become arrays (sorted when their items
    sort); dict keys that are not strings become ``str(key)``; ``NaN``, ``Infinity`` and
    ``-Infinity`` become those strings; a container that contains itself is cut with the string
    ``"..."``; everything else becomes its ``repr()``; lone surrogates in strings become U+FFFD.
    Nesting deeper than 200 levels is an error.
    """
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if math.isfinite(value):
            return float(value)
        if math.isnan(value):
            return "NaN"
        return "Infinity" if value > 0 else "-Infinity"
    if depth >= MAX_VALUE_DEPTH:
        raise ValueError(f"the return value nests deeper than {MAX_VALUE_DEPTH} levels")
    if isinstance(value, (list, tuple, set, frozenset, dict)):
        path = path if path is not None else set()
        if id(value) in path:
            return "..."
        path.add(id(value))
        try:
            if isinstance(value, dict):
                return {
                    (k if isinstance(k, str) else _key(k)): to_json_value(v, depth + 1, path)
                    for k, v in value.items()
                }
            items = value
            if isinstance(value, (set, frozenset)):
                try:
                    items = sorted(value)
                except TypeError:
                    items = list(value)
            return [to_json_value(v, depth + 1, path) for v in items]
        finally:
            path.discard(id(value))
    return _safe_repr(value)


def _key(key):
    if key is None or isinstance(key, (bool, int, float)):
        return json.dumps(to_json_value(key)).strip('"')
    return _safe_repr(key)


def _safe_repr(value):
    try:
        return repr(value)
    except RecursionError:
        return f"<{type(value).__name__} object: repr() recursed too deeply>"
    except BaseException:
        return f"<{type(value).__name__} object: repr() failed>"


def encode_value(value, max_bytes):
    """The return value as JSON text, at most ``max_bytes`` UTF-8 bytes long."""
    try:
        text = to_json_text(to_json_value(value))
    except (ValueError, RecursionError) as exc:
        raise Failure(GUEST_EXCEPTION, _one_line(f"ValueError: {exc}")) from None
    size = len(text.encode("utf-8"))
    if size > max_bytes:
        raise Failure(
            VALUE_TOO_LARGE,
            f"the return value is {size} bytes of JSON; the limit is {max_bytes}",
        )
    return text


# --------------------------------------------------------------------------------------------
# Errors shown to the host.


def _one_line(text):
    text = " ".join(str(text).split())
    return _cap(text, MAX_MESSAGE_CHARS)


def _cap(text, limit):
    if len(text) <= limit:
        return text
    half = limit // 2
    return text[:half] + f"\n... [{len(text) - limit} characters cut] ...\n" + text[-half:]


def _user_frames(tb):
    """Drops the runner's own frames from a traceback; keeps the user's and what they called."""
    runner_file = __file__
    summary = traceback.extract_tb(tb)
    kept = [f for f in summary if f.filename != runner_file]
    while kept and kept[0].filename != FILENAME:
        kept.pop(0)
    return traceback.StackSummary.from_list(kept)


def _exception_only_lines(te):
    """The exception's own lines, without an exception group's members.

    ``show_group`` is a parameter from Python 3.13 on; older interpreters never show the
    members here.
    """
    if sys.version_info >= (3, 13):
        return list(te.format_exception_only(show_group=False))
    return list(te.format_exception_only())


def _exc_type_str(te, exc):
    """The exception type as a traceback names it (``ZeroDivisionError``, ``json.X``).

    ``TracebackException.exc_type_str`` exists from Python 3.13 on; older interpreters get the
    same text built by the same rule.
    """
    if sys.version_info >= (3, 13):
        return te.exc_type_str
    cls = type(exc)
    name = cls.__qualname__
    module = cls.__module__
    if module not in ("__main__", "builtins"):
        name = f"{module}.{name}"
    return name


def exception_failure(exc):
    """A Failure describing an exception the code raised."""
    try:
        te = traceback.TracebackException.from_exception(exc, lookup_lines=True)
        # Trim the runner's frames from every exception in the chain.
        cur_te, cur_exc = te, exc
        while cur_te is not None and cur_exc is not None:
            cur_te.stack = _user_frames(cur_exc.__traceback__)
            if cur_te.__cause__ is not None:
                cur_te, cur_exc = cur_te.__cause__, cur_exc.__cause__
            elif cur_te.__context__ is not None:
                cur_te, cur_exc = cur_te.__context__, cur_exc.__context__
            else:
                break
        text = "".join(te.format())
        lines = _exception_only_lines(te)
        type_str = _exc_type_str(te, exc)
        headline = next((ln for ln in lines if ln.startswith(type_str)), lines[-1])
        message = _one_line(headline)
    except BaseException:
        text = None
        message = _one_line(f"{type(exc).__name__}: <the exception could not be formatted>")
    tb = _cap(text, MAX_TRACEBACK_CHARS) if text else None
    return Failure(GUEST_EXCEPTION, message, tb, type(exc).__name__)


# --------------------------------------------------------------------------------------------
# One run.


# The globals of the session this guest serves, from its first run in one on; `None` in a
# guest that serves one-shot runs (the host never mixes the two in one guest).
_session_globals = None


def run(code, request_json, call):
    """Runs ``code``; returns the JSON of its value or raises ``Failure``.

    ``request_json`` is the JSON object of the WIT ``run`` function: ``vars``, ``tools`` (a
    list of ``[binding, qualified, description]``), ``max_value_bytes``, and ``session``: when
    true, the code runs in the globals the session's earlier runs left (its variables,
    imports, functions and classes); the tools are bound at the session's first run.
    """
    global _session_globals
    try:
        request = json.loads(request_json)
        variables = request.get("vars", {})
        tools = [(b, q, d) for b, q, d in request.get("tools", [])]
        max_value_bytes = int(request["max_value_bytes"])
        session = request.get("session", False) is True
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise Failure(INVALID_INPUT, _one_line(f"the run request is malformed: {exc}")) from None
    if not isinstance(variables, dict):
        raise Failure(INVALID_INPUT, "variables must be a JSON object")
    for name in variables:
        if not name.isidentifier() or name.startswith("__"):
            raise Failure(INVALID_INPUT, f"variable name {name!r} is not an identifier")

    compiled, is_async, wrapped = compile_code(code)
    linecache.cache[FILENAME] = (len(code), None, code.splitlines(True), FILENAME)
    if not session:
        g = make_globals(call, tools, variables)
    elif _session_globals is None:
        g = _session_globals = make_globals(call, tools, variables)
    else:
        g = _session_globals
        g.update(variables)
    try:
        if wrapped:
            exec(compiled, g)
            main = g.pop(MAIN)
            # Tracebacks name the top level `<module>`, as for a script.
            main.__code__ = main.__code__.replace(co_name="<module>", co_qualname="<module>")
            result = main()
        else:
            result = eval(compiled, g)
        if is_async:
            loop = GuestEventLoop()
            try:
                value = loop.run_until_complete(result)
            finally:
                loop.close()
        else:
            value = result if wrapped else None
    except SystemExit as exc:
        if exc.code is None or exc.code == 0:
            value = None
        else:
            raise exception_failure(exc) from None
    except BaseException as exc:  # noqa: BLE001 - the code's own failure is the result
        raise exception_failure(exc) from None
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    return encode_value(value, max_value_bytes)
