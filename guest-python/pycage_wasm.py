"""The componentize-py entry point of the pycage wasm guest.

componentize-py runs this module's top level at build time and snapshots the interpreter's
heap afterwards, so every module imported here is ready, already initialised, the moment a run
starts. Modules that were not imported here are not in the component at all: ``PRELOAD`` is the
list of what the guest's code can import.
"""

import importlib
import random

import pycage_runner
from componentize_py_types import Err
from wit_world import exports
from wit_world.exports import guest as contract
from wit_world.imports import host

# What user code may import. Importing at build time costs nothing per run: the snapshot holds
# the initialised modules and each run maps that snapshot copy-on-write.
PRELOAD = (
    "abc", "argparse", "array", "ast", "asyncio", "base64", "binascii", "bisect", "calendar",
    "cmath", "codecs", "collections", "collections.abc", "colorsys", "contextlib",
    "contextvars", "copy", "csv", "dataclasses", "datetime", "decimal", "difflib", "enum",
    "errno", "fnmatch", "fractions", "functools", "gc", "getopt", "gettext", "glob", "graphlib",
    "gzip", "hashlib", "heapq", "hmac", "html", "html.entities", "html.parser", "inspect",
    "io", "ipaddress", "itertools", "json", "keyword", "linecache", "locale", "logging",
    "math", "numbers", "operator", "os", "os.path", "pathlib", "pprint", "queue", "quopri",
    "random", "re", "reprlib", "secrets", "select", "shlex", "socket", "statistics", "string",
    "stringprep", "struct", "sys", "tempfile", "textwrap", "time", "timeit", "token",
    "tokenize", "tomllib", "traceback", "types", "typing", "unicodedata", "urllib",
    "urllib.parse", "uuid", "warnings", "weakref", "xml", "xml.dom", "xml.dom.minidom",
    "xml.etree", "xml.etree.ElementTree", "zlib", "zoneinfo", "_strptime", "encodings.idna",
    "encodings.utf_16", "encodings.utf_32", "encodings.latin_1", "encodings.ascii",
    "encodings.cp1252", "json.tool", "email", "email.message", "email.utils", "string.templatelib",
    "zipfile", "sqlite3", "shutil", "copyreg", "dis", "opcode", "platform",
    "sysconfig", "unittest", "doctest", "traceback", "abc", "concurrent.futures", "threading",
)

MISSING = []
for _name in PRELOAD:
    try:
        importlib.import_module(_name)
    except ImportError:
        MISSING.append(_name)

pycage_runner.install_event_loop()

_TOOL_ERROR_KINDS = {
    host.ToolError_NotFound: "not-found",
    host.ToolError_InvalidArguments: "invalid-arguments",
    host.ToolError_Denied: "denied",
    host.ToolError_Failed: "failed",
    host.ToolError_LimitExceeded: "limit-exceeded",
}

_FAILURE_KINDS = {
    pycage_runner.SYNTAX_ERROR: contract.FailureKind.SYNTAX_ERROR,
    pycage_runner.GUEST_EXCEPTION: contract.FailureKind.GUEST_EXCEPTION,
    pycage_runner.INVALID_INPUT: contract.FailureKind.INVALID_INPUT,
    pycage_runner.VALUE_TOO_LARGE: contract.FailureKind.VALUE_TOO_LARGE,
}


def _call(name, args_json):
    try:
        return True, host.call_tool(name, args_json)
    except Err as err:
        value = err.value
        return False, (_TOOL_ERROR_KINDS.get(type(value), "failed"), value.value)


class Guest(exports.Guest):
    def run(self, request):
        try:
            # The snapshot baked one PRNG state into every instance; reseed from the host.
            random.seed()
            tools = [(t.binding, t.qualified, t.description) for t in request.tools]
            return pycage_runner.run(
                request.code, request.vars_json, tools, request.max_value_bytes, _call
            )
        except pycage_runner.Failure as failure:
            error = failure
        except BaseException as exc:  # noqa: BLE001 - escaping here would abort the guest
            error = pycage_runner.exception_failure(exc)
        raise Err(
            contract.Failure(
                kind=_FAILURE_KINDS[error.kind],
                message=error.message,
                traceback=error.traceback,
                exception=error.exception,
            )
        )
