"""pycage's MCP server driven by the official MCP Python SDK (see requirements.txt).

    python mcp_client.py -- <server command...>
    python mcp_client.py --http URL [--token-file FILE]
    python mcp_client.py --code-mode -- <server command...>

The first launches the server as a child speaking MCP on stdio through the SDK's `stdio_client`;
the second connects to a running `pycage mcp --listen` at URL (`http://127.0.0.1:PORT/mcp`)
through the SDK's `streamable_http_client`, sending `Authorization: Bearer <token>` (the token is
FILE's content, trimmed) on every request when FILE is given. Either way it talks to the server
only through the SDK's `ClientSession` (never hand-written JSON-RPC), and checks what a real
client sees: the tool listing, a run with host tool calls, a timeout that leaves the server
serving, a session across calls, files as embedded resources, progress notifications and
cancellation. Over stdio it also checks that the server's stdout carries nothing but JSON-RPC;
over HTTP it checks instead that the transport reports no fault.

In HTTP mode it then probes the server's HTTP guard with plain `httpx2` requests (the HTTP
client the SDK itself uses), each an `initialize` POST whose status it asserts: no token and a
wrong token are refused with 401 (only with --token-file), a foreign `Host` and a foreign
`Origin` with 403, a loopback `Origin` is served (200), and a body of 2 MiB with 413 (the server
is expected to run with `[http] max_body_bytes` at 1 MiB, or anything under 2 MiB).

In code mode the server is expected to run with the MCP project's reference server
(`@modelcontextprotocol/server-everything`, stdio) as `--upstream everything=...` and
`--namespace everything`: the checks read the upstream's tools as Python signatures in the
`run_python` description, then run one piece of code that chains many upstream calls with logic
between them, and see a refused upstream call come back to the code as a `ToolError`.

It prints one line per check and exits 1 with a message at the first failure (2 on bad usage).
The server is expected to be started with `--allow add`, `--max-concurrent 1` and a short
`--queue-timeout` (1s): the cancellation check then also proves that a cancelled run frees its
slot (the next call would otherwise queue behind a 20 s run), and the busy check sees a second
call beyond the one slot fail as `busy`.
"""

import inspect
import json
import os
import sys
import time
from typing import Any

import anyio
import httpx2
import mcp_types as types
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

SEED = (
    "total = 0\n"
    "for i in range(1, 6):\n"
    "    r = await add(a=str(total), b=str(i))\n"
    "    total = r['sum']\n"
    "return total"
)
SPIN = "import time\nt=time.monotonic()\nwhile time.monotonic()-t<1.5: pass\nreturn 1"
# A generous bound on one call, so a hung server fails the test instead of hanging it.
CALL_TIMEOUT = 120.0
# How long a call after a cancelled one may take: far less than the cancelled run's 20 s.
PROMPT_SECONDS = 10.0
# The body the HTTP probe sends to be refused as too large: twice the 1 MiB cap the server is
# expected to run with.
OVERSIZED_BODY_BYTES = 2 * 1024 * 1024
USAGE = "usage: python mcp_client.py -- <server command...>\n" \
        "       python mcp_client.py --http URL [--token-file FILE]\n" \
        "       python mcp_client.py --code-mode -- <server command...>"
# Code mode: one run that chains upstream calls, with logic between them, that a model would
# otherwise make one round trip at a time. `get_sum` answers in text ("The sum of 2 and 3 is
# 5."), `get_structured_content` with structured content (a dict in the code).
CHAIN = (
    "total = 0\n"
    "for i in range(1, 6):\n"
    "    said = await everything.get_sum(a=total, b=i)\n"
    "    total = int(said.rstrip('.').rsplit(' ', 1)[1])\n"
    "echo = await everything.echo(message=f'total {total}')\n"
    "weather = await everything.get_structured_content(location='Chicago')\n"
    "return {'total': total, 'echo': echo, 'keys': sorted(weather)}"
)


class CheckFailed(Exception):
    pass


passed = 0
skipped = 0


def ok(name: str, detail: str = "") -> None:
    global passed
    passed += 1
    print(f"ok    {name}" + (f" ({detail})" if detail else ""), flush=True)


def skip(name: str, reason: str) -> None:
    global skipped
    skipped += 1
    print(f"skip  {name}: {reason}", flush=True)


def expect(condition: bool, name: str, message: str) -> None:
    if not condition:
        raise CheckFailed(f"{name}: {message}")


def structured(result: types.CallToolResult, name: str) -> dict[str, Any]:
    s = result.structured_content
    expect(isinstance(s, dict), name, f"structuredContent is not an object: {s!r}")
    return s


def summary(result: types.CallToolResult) -> str:
    """The result as a failure message shows it."""
    text = " | ".join(b.text for b in result.content if isinstance(b, types.TextContent))
    return f"isError={result.is_error} structuredContent={result.structured_content!r} text={text[:2000]!r}"


async def run(session: ClientSession, arguments: dict[str, Any], **kwargs: Any) -> types.CallToolResult:
    return await session.call_tool("run_python", arguments, read_timeout_seconds=CALL_TIMEOUT, **kwargs)


async def run_ok(session: ClientSession, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    result = await run(session, arguments)
    expect(not result.is_error, name, f"the call failed: {summary(result)}")
    return structured(result, name)


async def check_listing(session: ClientSession) -> None:
    name = "list tools"
    listed = await session.list_tools()
    tools = {t.name: t for t in listed.tools}
    for wanted in ("run_python", "create_session", "close_session"):
        expect(wanted in tools, name, f"no `{wanted}` among {sorted(tools)}")
    ok(name, ", ".join(sorted(tools)))
    run_python = tools["run_python"]
    description = run_python.description or ""
    for needle in ("Wall time:", "Memory:"):
        expect(needle in description, "run_python description", f"no {needle!r} in {description!r}")
    ok("run_python description", "says its wall time and memory")
    schema = run_python.output_schema
    expect(isinstance(schema, dict) and schema.get("type") == "object", "run_python outputSchema",
           f"not an object schema: {schema!r}")
    ok("run_python outputSchema", "type object; the SDK validates each result against it")


async def check_seed(session: ClientSession) -> None:
    name = "seed example"
    s = await run_ok(session, name, {"code": SEED})
    value, calls = s.get("value"), s.get("tool_calls")
    expect(value == 15 and not isinstance(value, bool), name, f"value is {value!r}, not 15: {s!r}")
    expect(calls == 5, name, f"tool_calls is {calls!r}, not 5: {s!r}")
    ok(name, "value 15 after 5 tool calls")


async def check_timeout(session: ClientSession) -> None:
    name = "timeout"
    result = await run(session, {"code": "while True: pass", "limits": {"timeout_seconds": 0.5}})
    expect(result.is_error is True, name, f"not isError: {summary(result)}")
    error = structured(result, name).get("error")
    kind = error.get("kind") if isinstance(error, dict) else None
    expect(kind == "timeout", name, f"error.kind is {kind!r}, not 'timeout': {summary(result)}")
    ok(name, "isError, error.kind timeout")
    name = "alive after timeout"
    s = await run_ok(session, name, {"code": "return 'alive'"})
    expect(s.get("value") == "alive", name, f"value is {s.get('value')!r}")
    ok(name)


async def check_memory(session: ClientSession) -> None:
    name = "memory limit"
    result = await run(session, {"code": "b = bytearray(1 << 30)", "limits": {"memory_mib": 64}})
    expect(result.is_error is True, name, f"not isError: {summary(result)}")
    error = structured(result, name).get("error")
    kind = error.get("kind") if isinstance(error, dict) else None
    expect(kind == "memory_limit", name, f"error.kind is {kind!r}, not 'memory_limit': {summary(result)}")
    s = await run_ok(session, name, {"code": "return 1"})
    expect(s.get("value") == 1, name, f"the server did not serve the next call: {s!r}")
    ok(name, "1 GiB under a 64 MiB limit: isError, kind memory_limit; the next call served")


async def check_busy(session: ClientSession) -> None:
    name = "busy"
    # With one run slot (--max-concurrent 1): a second call while a run holds it waits the
    # queue timeout and fails as busy; then the holder is cancelled.
    with anyio.CancelScope() as scope:
        held = anyio.Event()

        async def hold() -> None:
            held.set()
            await run(session, {"code": "while True: pass", "limits": {"timeout_seconds": 20}})

        async with anyio.create_task_group() as tg:
            tg.start_soon(hold)
            await held.wait()
            await anyio.sleep(0.5)
            result = await run(session, {"code": "return 1"})
            scope.cancel()
    expect(result.is_error is True, name, f"not isError: {summary(result)}")
    error = structured(result, name).get("error")
    kind = error.get("kind") if isinstance(error, dict) else None
    expect(kind == "busy", name, f"error.kind is {kind!r}, not 'busy': {summary(result)}")
    ok(name, "a second call beyond one run slot: isError, kind busy")


async def check_session(session: ClientSession) -> None:
    name = "session"
    created = await session.call_tool("create_session", {}, read_timeout_seconds=CALL_TIMEOUT)
    expect(not created.is_error, name, f"create_session failed: {summary(created)}")
    sid = structured(created, name).get("session_id")
    expect(isinstance(sid, str) and sid != "", name, f"create_session gave no session_id: {summary(created)}")
    for code in ("x = 40", "x += 1"):
        await run_ok(session, name, {"code": code, "session_id": sid})
    s = await run_ok(session, name, {"code": "return x + 1", "session_id": sid})
    expect(s.get("value") == 42, name, f"value is {s.get('value')!r}, not 42: {s!r}")
    closed = await session.call_tool("close_session", {"session_id": sid}, read_timeout_seconds=CALL_TIMEOUT)
    expect(not closed.is_error, name, f"close_session failed: {summary(closed)}")
    ok(name, "x = 40; x += 1; return x + 1 -> 42 in one session, then closed")


async def check_files(session: ClientSession) -> None:
    name = "files"
    code = "open('out.txt','w').write(open('in.txt').read().upper())"
    result = await run(session, {"code": code, "files": {"in.txt": "hello"}})
    expect(not result.is_error, name, f"the call failed: {summary(result)}")
    files = structured(result, name).get("files")
    paths = [f.get("path") for f in files if isinstance(f, dict)] if isinstance(files, list) else []
    expect("out.txt" in paths, name, f"structuredContent.files does not list out.txt: {files!r}")
    embedded = [
        b.resource for b in result.content
        if isinstance(b, types.EmbeddedResource) and isinstance(b.resource, types.TextResourceContents)
    ]
    texts = {str(r.uri): r.text for r in embedded}
    expect("HELLO" in texts.values(), name, f"no embedded resource with text 'HELLO': {texts!r}")
    uri = next(u for u, t in texts.items() if t == "HELLO")
    ok(name, f"out.txt listed; embedded resource {uri} holds HELLO")


async def check_progress(session: ClientSession) -> None:
    name = "progress"
    if "progress_callback" not in inspect.signature(ClientSession.call_tool).parameters:
        skip(name, "this SDK's call_tool takes no progress_callback")
        return
    seen: list[float] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append(progress)

    result = await run(session, {"code": SPIN}, progress_callback=on_progress)
    expect(not result.is_error, name, f"the call failed: {summary(result)}")
    expect(structured(result, name).get("value") == 1, name, f"value is not 1: {summary(result)}")
    expect(len(seen) >= 1, name, "no notifications/progress arrived during a 1.5 s run")
    ok(name, f"{len(seen)} notification(s) during a 1.5 s run, last progress {seen[-1]}")


async def check_cancel(session: ClientSession) -> None:
    name = "cancellation"
    # The SDK's own mechanism: cancelling the scope a call_tool awaits in sends the server
    # notifications/cancelled for that request (its dispatcher's "courtesy cancel").
    outcome: list[str] = []
    with anyio.CancelScope() as scope:

        async def spin() -> None:
            try:
                await run(session, {"code": "while True: pass", "limits": {"timeout_seconds": 20}})
                outcome.append("returned")
            except anyio.get_cancelled_exc_class():
                outcome.append("cancelled")
                raise

        async with anyio.create_task_group() as tg:
            tg.start_soon(spin)
            await anyio.sleep(0.5)
            scope.cancel()
    expect(outcome == ["cancelled"], name, f"the call was not cancelled but {outcome!r}")
    started = time.monotonic()
    s = await run_ok(session, name, {"code": "return 2"})
    took = time.monotonic() - started
    expect(s.get("value") == 2, name, f"value is {s.get('value')!r}, not 2")
    expect(took < PROMPT_SECONDS, name, f"the call after the cancelled one took {took:.1f} s")
    ok(name, f"cancelled after 0.5 s; the next call answered in {took:.2f} s")


CHECKS = (check_listing, check_seed, check_timeout, check_memory, check_session, check_files, check_progress,
          check_cancel, check_busy)


async def check_upstream_listing(session: ClientSession) -> None:
    name = "code mode: description"
    listed = await session.list_tools()
    tools = {t.name: t for t in listed.tools}
    expect("run_python" in tools, name, f"no run_python among {sorted(tools)}")
    description = tools["run_python"].description or ""
    for needle in ("everything.get_sum", "async def get_sum(*, a: float, b: float)", "everything.echo"):
        expect(needle in description, name, f"no {needle!r} in the description")
    ok(name, "lists the upstream's tools as Python signatures")


async def check_upstream_chain(session: ClientSession) -> None:
    name = "code mode: chained upstream calls"
    s = await run_ok(session, name, {"code": CHAIN})
    value, calls = s.get("value"), s.get("tool_calls")
    want = {"total": 15, "echo": "Echo: total 15", "keys": ["conditions", "humidity", "temperature"]}
    expect(value == want, name, f"value is {value!r}, not {want!r}")
    expect(calls == 7, name, f"tool_calls is {calls!r}, not 7")
    ok(name, "7 upstream calls in one run_python call: total 15, echo and structured content")


async def check_upstream_error(session: ClientSession) -> None:
    name = "code mode: refused upstream call"
    # A required argument missing: the upstream refuses the call; the code sees a ToolError.
    code = (
        "try:\n"
        "    await everything.get_sum(a=1)\n"
        "except ToolError as e:\n"
        "    return e.kind\n"
        "return 'no error'"
    )
    s = await run_ok(session, name, {"code": code})
    expect(s.get("value") == "failed", name, f"value is {s.get('value')!r}, not 'failed': {s!r}")
    s = await run_ok(session, name, {"code": "return await everything.echo(message='still here')"})
    expect(s.get("value") == "Echo: still here", name, f"the next call gave {s!r}")
    ok(name, "a ToolError in the code, and the upstream still serves")


CODE_MODE_CHECKS = (check_upstream_listing, check_upstream_chain, check_upstream_error)


class StrayWatch:
    """What the transport could not deliver as a message reaches the session's message handler as
    an exception (over stdio: a stray non-protocol line on the server's stdout; over HTTP: a body
    or event that is not JSON-RPC, a failed stream); every check then fails on it."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.stray: list[Exception] = []

    async def on_message(self, message: Any) -> None:
        if isinstance(message, Exception):
            self.stray.append(message)

    def clean(self, after: str) -> None:
        if self.stray:
            raise CheckFailed(f"protocol stream: after {after}, {self.what}: {self.stray[0]!r}")


async def run_checks(session: ClientSession, watch: StrayWatch, checks: tuple = CHECKS) -> None:
    with anyio.fail_after(CALL_TIMEOUT):
        init = await session.initialize()
    watch.clean("initialize")
    expect(init.protocol_version not in ("2024-11-05", "2025-03-26"), "initialize",
           f"protocol {init.protocol_version} predates structuredContent and outputSchema (2025-06-18)")
    ok("initialize", f"{init.server_info.name} {init.server_info.version}, protocol {init.protocol_version}")
    for check in checks:
        await check(session)
        watch.clean(check.__name__)


async def main_stdio(command: list[str], checks: tuple = CHECKS) -> None:
    # The server gets this process's whole environment (the SDK's default passes only a few
    # variables), so it finds the same caches and settings as the test that runs it.
    params = StdioServerParameters(command=command[0], args=command[1:], env=dict(os.environ))
    watch = StrayWatch("the server's stdout carried a line that is not JSON-RPC")
    async with (
        stdio_client(params) as (read, write),
        ClientSession(read, write, message_handler=watch.on_message) as session,
    ):
        await run_checks(session, watch, checks)


def http_timeout() -> httpx2.Timeout:
    # The SDK's own defaults for its HTTP client: 30 s to connect and write, 5 min between bytes
    # of a response (a run's event stream may stay quiet for a while).
    return httpx2.Timeout(30.0, read=300.0)


async def main_http(url: str, token: str | None) -> None:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    watch = StrayWatch("the HTTP transport reported a fault")
    # The SDK's way to set headers: its transport sends every request through this client.
    async with (
        httpx2.AsyncClient(headers=headers, timeout=http_timeout()) as client,
        streamable_http_client(url, http_client=client) as (read, write),
        ClientSession(read, write, message_handler=watch.on_message) as session,
    ):
        await run_checks(session, watch)
    await check_http_guard(url, token)


def initialize_body() -> str:
    """An `initialize` request as a client's first POST carries it (the probes' body)."""
    return json.dumps({
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "pycage-interop-probe", "version": "0"},
        },
    })


async def check_http_guard(url: str, token: str | None) -> None:
    """Raw requests at the HTTP layer: they test the server's guard, not the protocol."""
    base = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    auth = {"Authorization": f"Bearer {token}"} if token is not None else {}
    body = initialize_body()

    async with httpx2.AsyncClient(timeout=http_timeout()) as client:

        async def probe(name: str, headers: dict[str, str], want: int, content: str = body) -> str:
            try:
                # Streamed, so a served `initialize` (an event stream) is not read to its end.
                async with client.stream("POST", url, content=content, headers={**base, **headers}) as response:
                    status = response.status_code
                    text = ""
                    if status != 200:
                        text = (await response.aread()).decode("utf-8", "replace").strip()
                    session_id = response.headers.get("mcp-session-id")
            except httpx2.HTTPError as e:
                raise CheckFailed(f"{name}: the request failed: {type(e).__name__}: {e}") from e
            expect(status == want, name, f"status {status}, not {want}" + (f": {text[:300]!r}" if text else ""))
            if session_id:
                # A served probe opened an MCP session: end it, as a client closing would.
                await client.delete(url, headers={**auth, "mcp-session-id": session_id})
            return text

        if token is None:
            skip("http: no token", "no --token-file, so the server is not expected to ask for one")
            skip("http: wrong token", "no --token-file, so the server is not expected to ask for one")
        else:
            text = await probe("http: no token", {}, 401)
            ok("http: no token", f"401 {text[:80]!r}" if text else "401")
            text = await probe("http: wrong token", {"Authorization": "Bearer wrong"}, 401)
            ok("http: wrong token", f"401 {text[:80]!r}" if text else "401")
        text = await probe("http: foreign Host", {**auth, "Host": "evil.example"}, 403)
        ok("http: foreign Host", f"Host: evil.example -> 403 {text[:80]!r}" if text else "403")
        text = await probe("http: foreign Origin", {**auth, "Origin": "http://evil.example"}, 403)
        ok("http: foreign Origin", f"Origin: http://evil.example -> 403 {text[:80]!r}" if text else "403")
        await probe("http: loopback Origin", {**auth, "Origin": "http://localhost:3000"}, 200)
        ok("http: loopback Origin", "Origin: http://localhost:3000 -> 200")
        # The initialize request padded with trailing whitespace (still valid JSON) to 2 MiB.
        big = body + " " * (OVERSIZED_BODY_BYTES - len(body))
        text = await probe("http: oversized body", auth, 413, content=big)
        ok("http: oversized body", f"{len(big)} bytes -> 413 {text[:80]!r}" if text else f"{len(big)} bytes -> 413")


def parse(args: list[str]) -> tuple[str, Any] | None:
    """("stdio", command), ("code-mode", command) or ("http", (url, token)); None on bad usage
    (reported on stderr)."""
    if args[:1] == ["--code-mode"]:
        args = args[1:]
        if args[:1] == ["--"]:
            args = args[1:]
        return ("code-mode", args) if args else None
    if args[:1] not in (["--http"], ["--token-file"]):
        if args[:1] == ["--"]:
            args = args[1:]
        return ("stdio", args) if args else None
    # `--http URL` and `--token-file FILE`, in either order, each at most once.
    flags: dict[str, str] = {}
    rest = args
    while rest:
        if rest[0] not in ("--http", "--token-file") or rest[0] in flags or len(rest) < 2:
            return None
        flags[rest[0]], rest = rest[1], rest[2:]
    url, token_file = flags.get("--http"), flags.get("--token-file")
    if not url:
        return None
    token = None
    if token_file is not None:
        try:
            with open(token_file, encoding="utf-8") as f:
                token = f.read().strip()
        except OSError as e:
            print(f"mcp_client.py: cannot read the token file: {e}", file=sys.stderr)
            return None
        if not token:
            print(f"mcp_client.py: the token file {token_file} is empty", file=sys.stderr)
            return None
    return ("http", (url, token))


def entry() -> int:
    parsed = parse(sys.argv[1:])
    if parsed is None:
        print(USAGE, file=sys.stderr)
        return 2
    mode, how = parsed
    try:
        if mode == "stdio":
            anyio.run(main_stdio, how)
        elif mode == "code-mode":
            anyio.run(main_stdio, how, CODE_MODE_CHECKS)
        else:
            anyio.run(main_http, *how)
    except CheckFailed as e:
        print(f"FAIL  {e}", flush=True)
        return 1
    except Exception as e:  # the SDK's own errors: a protocol error, a closed connection, a bad result
        # An ExceptionGroup from a task group: report the first real cause.
        while isinstance(e, BaseExceptionGroup) and e.exceptions:
            e = e.exceptions[0]
        if isinstance(e, CheckFailed):
            print(f"FAIL  {e}", flush=True)
        else:
            print(f"FAIL  {type(e).__name__}: {e}", flush=True)
        return 1
    print(f"interop: all {passed} checks passed, {skipped} skipped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(entry())
