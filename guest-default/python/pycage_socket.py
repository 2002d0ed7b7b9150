"""The guest entry point of pycage's operating-system backends.

A native CPython (3.11 or newer) runs this file inside the OS sandbox::

    python3 -I -B pycage_socket.py  < header line + code

Standard input holds one JSON header line, ``{"socket": path, "token": ..., "request_json":
..., "max_args_bytes": N}``, followed by the code (UTF-8, the rest of the input). The script connects to the host's
broker over the run's private Unix socket (or, on Windows, when ``socket`` is a pipe name
``\\\\.\\pipe\\...``, over the run's named pipe), runs the code with ``pycage_runner.run`` (the
same guest logic the wasm backend uses; only this transport differs) and sends the outcome as
the run's result frame. The process's stdout and stderr are the guest's own: the host captures
them.

With ``"workdir_socket"`` and ``"workdir"`` in the header (bubblewrap's one-shot runs), the
working directory's descriptor goes to the host over that socket before the code runs, and the
code waits until the host has written the input files into it.

For a session (``"session": true`` in the header, and no code after it) the process serves run
after run: it asks the host for its next run (a ``next`` request, answered when the host
starts one with the code, the runner's request, the run's cap on call arguments and the run's
end-of-output marker), runs it in the globals earlier runs left, writes the marker to its
stdout and stderr (the host takes what came before it as the run's output) and sends the
outcome, until the host ends the session.

Frames are a 4-byte big-endian length and a JSON object. Every request carries the run's token;
the host checks it, and every policy, on its side. Nothing here is trusted by the host.
"""

import json
import os
import signal
import socket
import struct
import sys
import threading
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import pycage_runner  # noqa: E402 - found through the line above

# The exit status that tells the host the guest could not start (no header, no socket): a
# sandbox failure, not the code's.
BOOTSTRAP_FAILED = 121

# The broker's error kinds; anything else the host answers (`unauthorized`, `bad-request`)
# reaches the code as a failed call.
_TOOL_ERROR_KINDS = frozenset(
    ("not-found", "invalid-arguments", "denied", "failed", "limit-exceeded")
)
_HEADER = struct.Struct(">I")

# A Windows named pipe's name, as the host writes it in the header.
_PIPE_PREFIX = "\\\\.\\pipe\\"
# ERROR_PIPE_BUSY: every instance of the pipe is connected; the host makes the next one at once.
_ERROR_PIPE_BUSY = 231
_PIPE_BUSY_RETRIES = 200
_PIPE_BUSY_WAIT_SECONDS = 0.01
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


class Connection:
    """The guest's connection to the host broker: one request at a time, from any thread.

    A forked child opens its own connection on first use, so parent and child never interleave
    frames on one stream.
    """

    def __init__(self, path, token, max_args_bytes):
        self._path = path
        self._max_args_bytes = max_args_bytes
        self._token_json = _ENCODER.encode(token)
        self._lock = threading.Lock()
        self._sock = None
        self._pid = None
        self._next_id = 0
        if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
            os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self):
        self._lock = threading.Lock()
        self._sock = None

    def connect(self):
        """Connects now (the bootstrap checks that the socket is there)."""
        with self._lock:
            self._ensure()

    def _ensure(self):
        if self._sock is None or self._pid != os.getpid():
            if self._path.startswith(_PIPE_PREFIX):
                sock = _Pipe.open(self._path)
            else:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    sock.connect(self._path)
                except BaseException:
                    sock.close()
                    raise
            self._sock = sock
            self._pid = os.getpid()
        return self._sock

    def _exchange(self, fields_json):
        """Sends one request (its fields after token and id, as JSON text) and returns the
        decoded response."""
        with self._lock:
            self._next_id += 1
            body = (
                '{"token":' + self._token_json + ',"id":' + str(self._next_id) + "," + fields_json + "}"
            ).encode("utf-8", "replace")
            sock = self._ensure()
            try:
                sock.sendall(_HEADER.pack(len(body)) + body)
                (length,) = _HEADER.unpack(_recv_exact(sock, _HEADER.size))
                return json.loads(_recv_exact(sock, length))
            except BaseException:
                # The stream's framing is lost: the next request opens a new connection.
                self._sock = None
                sock.close()
                raise

    def call(self, name, args_json):
        """The runner's transport: ``(True, result_json)`` or ``(False, (kind, message))``."""
        if not isinstance(name, str):
            return False, ("invalid-arguments", "the tool name must be a string")
        # The broker refuses arguments over the cap; checking here first keeps a frame over
        # the socket's cap (which would close the connection) off the wire.
        size = len(args_json.encode("utf-8", "replace"))
        if size > self._max_args_bytes:
            return False, (
                "limit-exceeded",
                f"tool arguments are {size} bytes; the limit is {self._max_args_bytes}",
            )
        # `args_json` is the runner's own encoding of a dict: a JSON object, spliced as is
        # (the host parses every frame strictly, so a bad one is only refused).
        fields = '"method":"call","name":' + _ENCODER.encode(name) + ',"arguments":' + args_json
        try:
            response = self._exchange(fields)
        except (OSError, ValueError, struct.error):
            return False, ("failed", "the connection to the host broker failed")
        return _decode_response(response)

    def set_max_args_bytes(self, max_args_bytes):
        """The cap on one call's arguments, from this run on (a session's runs each have theirs)."""
        self._max_args_bytes = max_args_bytes

    def next_job(self):
        """Asks for the session's next run and waits for it; ``None`` once the session is over."""
        response = self._exchange('"method":"next"')
        if isinstance(response, dict) and response.get("ok") is True:
            job = response.get("result_json")
            if isinstance(job, str):
                return json.loads(job)
        return None

    def send_result(self, outcome):
        """Sends the run's outcome and waits for the host to acknowledge it."""
        response = self._exchange('"method":"result","outcome":' + _ENCODER.encode(outcome))
        if not (isinstance(response, dict) and response.get("ok") is True):
            raise RuntimeError("the host did not accept the result")


class _Pipe:
    """A Windows named pipe with the two socket methods the connection uses, over plain file
    I/O (the host's frames and token are the same as on the Unix socket)."""

    def __init__(self, file):
        self._file = file

    @classmethod
    def open(cls, path):
        for _ in range(_PIPE_BUSY_RETRIES):
            try:
                return cls(open(path, "r+b", buffering=0))
            except OSError as exc:
                if getattr(exc, "winerror", None) != _ERROR_PIPE_BUSY:
                    raise
            time.sleep(_PIPE_BUSY_WAIT_SECONDS)
        raise ConnectionError("the host's pipe stayed busy")

    def sendall(self, data):
        view = memoryview(data)
        while view:
            written = self._file.write(view)
            if not written:
                raise ConnectionError("the host closed the connection")
            view = view[written:]

    def recv(self, n):
        return self._file.read(n) or b""

    def close(self):
        self._file.close()


def _recv_exact(sock, n):
    chunks = []
    while n:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            raise ConnectionError("the host closed the connection")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _decode_response(response):
    if not isinstance(response, dict):
        return False, ("failed", "the host sent a malformed response")
    if response.get("ok") is True:
        result = response.get("result_json")
        if isinstance(result, str):
            return True, result
        return False, ("failed", "the host sent a malformed response")
    error = response.get("error")
    if not isinstance(error, dict):
        return False, ("failed", "the host sent a malformed response")
    kind = error.get("kind")
    message = error.get("message")
    if not isinstance(message, str):
        message = "the call failed"
    if kind not in _TOOL_ERROR_KINDS:
        kind = "failed"
    return False, (kind, message)


def _outcome(failure):
    return {
        "ok": False,
        "kind": failure.kind,
        "message": failure.message,
        "traceback": failure.traceback,
        "exception": failure.exception,
    }


def _hand_over_workdir(path, workdir):
    """Sends the working directory (a tmpfs the sandbox made) to the host, which writes the
    input files into it and, after the run, reads the produced files back through it; waits
    until the inputs are in place. Runs before the code: the host takes one connection only."""
    fd = os.open(workdir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(path)
            socket.send_fds(sock, [b"w"], [fd])
            if sock.recv(1) != b"k":
                raise ConnectionError("the host did not set up the working directory")
    finally:
        os.close(fd)


def _bootstrap():
    """Reads the header and the code, and connects; exits with BOOTSTRAP_FAILED if it cannot.

    Returns the connection, and the code and request of a one-shot run (``None, None`` for a
    session's guest, whose runs come over the connection)."""
    try:
        stdin = sys.stdin.buffer
        header = json.loads(stdin.readline())
        connection = Connection(header["socket"], header["token"], int(header["max_args_bytes"]))
        connection.connect()
        if "workdir_socket" in header:
            _hand_over_workdir(header["workdir_socket"], header["workdir"])
        if header.get("session") is True:
            return connection, None, None
        code = stdin.read().decode("utf-8")
        return connection, code, header["request_json"]
    except BaseException as exc:  # noqa: BLE001 - any failure here is the sandbox's
        sys.stderr.write(f"pycage: the guest could not start ({type(exc).__name__})\n")
        sys.stderr.flush()
        os._exit(BOOTSTRAP_FAILED)


# The outcome of a run that exhausted its memory, built before the code runs: when memory is
# gone, describing the failure (a traceback, a message) can fail too.
_OUT_OF_MEMORY = {
    "ok": False,
    "kind": pycage_runner.GUEST_EXCEPTION,
    "message": "MemoryError",
    "traceback": None,
    "exception": "MemoryError",
}


# True while a run's code runs: only then does SIGINT (a session run's deadline) interrupt.
_running = False


def _interrupt(signum, frame):
    """SIGINT: the host's interrupt at a session run's deadline, as Ctrl-C in a notebook.

    ``KeyboardInterrupt`` in the running code; between runs (an interrupt that came as the
    run ended) nothing, so the session's loop is never cut.
    """
    if _running:
        raise KeyboardInterrupt


def _run(connection, code, request_json):
    """The run's outcome. Whatever the code holds is released when this returns."""
    global _running
    try:
        _running = True
        try:
            value_json = pycage_runner.run(code, request_json, connection.call)
        finally:
            _running = False
        return {"ok": True, "value_json": value_json}
    except pycage_runner.Failure as failure:
        return _outcome(failure)
    except MemoryError:
        return _OUT_OF_MEMORY
    except BaseException as exc:  # noqa: BLE001 - the code's own failure is the result
        try:
            return _outcome(pycage_runner.exception_failure(exc))
        except MemoryError:
            return _OUT_OF_MEMORY


def _flush():
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001 - a closed or replaced stream is the code's business
            pass


def _mark(marker):
    """Writes the run's end-of-output marker to the process's stdout and stderr."""
    for fd in (1, 2):
        view = memoryview(marker)
        try:
            while view:
                view = view[os.write(fd, view) :]
        except OSError:  # the code closed or broke the stream: the host waits a moment only
            pass


def _serve_session(control):
    """Serves a session's runs, one after another, until the host ends the session.

    Tool calls travel on their own connection; ``control`` carries only ``next`` and the
    results, so a call from a thread the code left running never waits behind the host's
    answer to ``next``.
    """
    tools = Connection(control._path, json.loads(control._token_json), control._max_args_bytes)
    signal.signal(signal.SIGINT, _interrupt)
    while True:
        try:
            job = control.next_job()
        except BaseException:  # noqa: BLE001 - the host closed the session
            os._exit(0)
        if job is None:
            os._exit(0)
        try:
            code = job["code"]
            request_json = job["request_json"]
            marker = job["marker"].encode("utf-8")
            tools.set_max_args_bytes(int(job["max_args_bytes"]))
        except BaseException:  # noqa: BLE001 - a malformed job is the host's failure
            os._exit(BOOTSTRAP_FAILED)
        outcome = _run(tools, code, request_json)
        _flush()
        _mark(marker)
        try:
            control.send_result(outcome)
        except BaseException:  # noqa: BLE001 - the host sees the missing result
            os._exit(BOOTSTRAP_FAILED)
        del outcome


def main():
    connection, code, request_json = _bootstrap()
    if code is None:
        _serve_session(connection)
    try:
        outcome = _run(connection, code, request_json)
        # The exception, its traceback and the code's globals are gone now: memory is back.
        connection.send_result(outcome)
    except BaseException:  # noqa: BLE001 - the host sees the missing result
        os._exit(BOOTSTRAP_FAILED)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001 - a closed stream is the code's business
            pass
    # Threads the code left running, and its exit handlers, do not hold the run open.
    os._exit(0)


if __name__ == "__main__":
    main()
