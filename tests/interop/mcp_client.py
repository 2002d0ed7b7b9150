"""pycage's MCP server driven by the official MCP Python SDK (see requirements.txt).

    python mcp_client.py -- <server command...>

launches the server as a child speaking MCP on stdio through the SDK's `stdio_client`, talks to
it only through the SDK's `ClientSession` (never hand-written JSON-RPC), and checks what a real
client sees: the tool listing, a run with host tool calls, a timeout that leaves the server
serving, a session across calls, files as embedded resources, progress notifications and
cancellation. It prints one line per check and exits 1 with a message at the first failure
(2 on bad usage). The server is expected to be started with `--allow add`; with
`--max-concurrent 1` the cancellation check also proves that a cancelled run frees its slot
(the next call would otherwise queue behind a 20 s run).
"""

import inspect
import os
import sys
import time
from typing import Any

import anyio
import mcp_types as types
from mcp import ClientSession, StdioServerParameters, stdio_client

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


async def main(command: list[str]) -> None:
    # The server gets this process's whole environment (the SDK's default passes only a few
    # variables), so it finds the same caches and settings as the test that runs it.
    params = StdioServerParameters(command=command[0], args=command[1:], env=dict(os.environ))
    # What the transport could not parse (a stray non-protocol line on the server's stdout)
    # reaches the message handler as an exception; every check then fails on it.
    stray: list[Exception] = []

    async def on_message(message: Any) -> None:
        if isinstance(message, Exception):
            stray.append(message)

    def clean(after: str) -> None:
        if stray:
            raise CheckFailed(f"protocol stream: after {after}, the server's stdout carried a line "
                              f"that is not JSON-RPC: {stray[0]!r}")

    async with (
        stdio_client(params) as (read, write),
        ClientSession(read, write, message_handler=on_message) as session,
    ):
        with anyio.fail_after(CALL_TIMEOUT):
            init = await session.initialize()
        clean("initialize")
        expect(init.protocol_version not in ("2024-11-05", "2025-03-26"), "initialize",
               f"protocol {init.protocol_version} predates structuredContent and outputSchema (2025-06-18)")
        ok("initialize", f"{init.server_info.name} {init.server_info.version}, protocol {init.protocol_version}")
        for check in (check_listing, check_seed, check_timeout, check_session, check_files,
                      check_progress, check_cancel):
            await check(session)
            clean(check.__name__)


def entry() -> int:
    args = sys.argv[1:]
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        print("usage: python mcp_client.py -- <server command...>", file=sys.stderr)
        return 2
    try:
        anyio.run(main, args)
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
