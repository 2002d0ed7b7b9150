"""The standard library beyond the preloaded modules, imported on demand from the snapshot.

componentize-py gives the guest the standard library only at build time: at run time there is
no file system to import from, so a module that was not imported before the snapshot did not
exist. ``build`` compiles every other module of the standard library (``.py`` under the
interpreter's own library, minus what cannot run here, see ``SKIP``) and keeps its code,
marshalled and compressed. ``Store`` is the finder and loader that imports from them: a module
is decompressed, unmarshalled and run in the run that imports it. The bytes live in the
snapshot (mapped copy-on-write, never written) and are immutable; nothing is read from any
directory, host or guest.

Why compressed, and why without the source: every byte the snapshot holds is memory no run can
have (the snapshot lies at the start of the guest's linear memory, inside its limit). Kept
plain, the code took 5.8 MiB and the source 1.5 MiB compressed, and under the smallest memory
limit (64 MiB) a run could no longer have 36 MiB in one piece; compressed, the code takes 2.3
MiB. Decompressing costs a run about 15 µs per KiB of code it imports (1.25 ms of `pickle`'s
85 KiB; measured in the guest). The preloaded modules have no source at run time either, so a
traceback shows the same for both: file, line and function.

Keep ``SKIP`` in step with the README's list of modules that do not import, which
``tests/it/stdlib.rs`` checks against the guest.
"""

import errno
import marshal
import os
import sys
import zlib
from importlib.machinery import ModuleSpec

# Directories and modules of the library that are not stored: tests, packages' `__main__`
# (what `python -m` runs), and what needs Tk (no display here) or installs pip with a
# subprocess. Each importable name among them is in the README's list with its reason.
SKIP = frozenset(
    {
        "__pycache__",
        "site-packages",
        "config-3.14-wasm32-wasi",
        "test",
        "tests",
        "idle_test",
        "idlelib",
        "tkinter",
        "turtle",
        "turtledemo",
        "ensurepip",
        "__phello__",
        "__hello__",
        "__main__",
    }
)


class Store:
    """Finds and loads modules from the marshalled code ``build`` collected.

    ``index`` maps a module's name to ``(is_package, code, origin)``: its marshalled code,
    compressed with zlib, and the path it had when the guest was built, which the module gets
    as ``__file__`` (the one its code objects name).
    """

    def __init__(self, index):
        self._index = index

    def __contains__(self, name):
        return name in self._index

    def names(self):
        """The names of every module stored."""
        return list(self._index)

    def find_spec(self, name, path=None, target=None):
        entry = self._index.get(name)
        if entry is None:
            return None
        spec = ModuleSpec(name, self, origin=entry[2], is_package=entry[0])
        spec.has_location = True
        return spec

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        name = module.__spec__.name
        exec(self.get_code(name), module.__dict__)
        fix = _FIXES.get(name)
        if fix is not None:
            fix(module)

    def is_package(self, name):
        return self._entry(name)[0]

    def get_code(self, name):
        return marshal.loads(zlib.decompress(self._entry(name)[1]))

    def get_source(self, name):
        self._entry(name)
        return None  # not kept (see the module's docstring)

    def get_filename(self, name):
        return self._entry(name)[2]

    def _entry(self, name):
        entry = self._index.get(name)
        if entry is None:
            raise ImportError(f"no module named {name!r} in the stored library", name=name)
        return entry


def _no_processes(*args, **kwargs):
    raise OSError(errno.ENOTSUP, f"{sys.platform} does not support processes.")


def _fix_multiprocessing_context(module):
    """Starting a process fails as ``subprocess`` fails here: an ``OSError``, not the
    ``AttributeError`` of a missing ``os.WNOHANG`` deep inside ``multiprocessing``."""
    for value in vars(module).values():
        if isinstance(value, type) and "_Popen" in vars(value):
            value._Popen = staticmethod(_no_processes)


def _fix_multiprocessing_connection(module):
    """``Pipe`` (and so ``Queue``, ``Pool`` and managers) fails with an ``OSError``: WASI has
    neither ``os.pipe`` nor ``socket.socketpair``."""
    module.Pipe = _no_processes


def _fix_urllib_request(module):
    """``urlopen`` of an http or https URL goes through the host's ``net.fetch`` tool, which
    applies the run's network allowlist; every opener has it (the default ``HTTPHandler``
    opens both schemes, as this CPython has no ``ssl``). A refusal is a ``URLError`` with the
    host's reason; a status of 400 or more an ``HTTPError``, as urllib's users expect."""

    def _open(self, req):
        import base64
        import email.message
        import http
        import io
        import urllib.error
        import urllib.response

        import pycage_runner

        call = pycage_runner.CURRENT_CALL[0]
        if call is None:
            raise urllib.error.URLError("no network: there is no run")
        data = req.data
        if data is not None and not isinstance(data, (bytes, bytearray)):
            data = b"".join(data)
        args = {
            "url": req.full_url,
            "method": req.get_method(),
            # urllib adds Host and the framing headers itself; the host's client sets them.
            "headers": {
                k: v
                for k, v in req.header_items()
                if k.lower() not in ("host", "content-length", "connection", "transfer-encoding")
            },
        }
        if data is not None:
            args["body_base64"] = base64.b64encode(data).decode("ascii")
        try:
            r = pycage_runner.invoke_tool(call, "net.fetch", args)
        except pycage_runner.ToolError as e:
            reason = str(e)
            if e.kind == "not-found":
                reason = f"no network: {reason} (the host exposes net.fetch with --net-allow)"
            raise urllib.error.URLError(reason) from None
        if "body" in r:
            body = r["body"].encode("utf-8")
        else:
            body = base64.b64decode(r["body_base64"])
        headers = email.message.Message()
        for name, value in r["headers"].items():
            headers[name] = value
        response = urllib.response.addinfourl(io.BytesIO(body), headers, r["url"], r["status"])
        try:
            response.msg = http.HTTPStatus(r["status"]).phrase
        except ValueError:
            response.msg = ""
        return response

    module.HTTPHandler.http_open = _open
    module.HTTPHandler.https_open = _open


# Fixes applied to a module once it has run, so that what cannot work here fails with the
# error that code written for it expects.
_FIXES = {
    "urllib.request": _fix_urllib_request,
    "multiprocessing.context": _fix_multiprocessing_context,
    "multiprocessing.connection": _fix_multiprocessing_connection,
}


def _sources(root):
    """Each stored module of the library under ``root``: ``(name, is_package, path)``."""
    for top, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIP and "." not in d and "-" not in d)
        rel = os.path.relpath(top, root)
        package = [] if rel == "." else rel.split(os.sep)
        for f in sorted(files):
            stem, ext = os.path.splitext(f)
            if ext != ".py" or stem in SKIP:
                continue
            if stem == "__init__":
                if package:
                    yield ".".join(package), True, os.path.join(top, f)
            else:
                yield ".".join([*package, stem]), False, os.path.join(top, f)


def build(root, loaded):
    """Compiles every module under ``root`` that is not in ``loaded`` into a ``Store``.

    The code is compiled as the interpreter's importer would compile it (no optimisation, so
    docstrings and asserts stay); a module of the library that does not compile here is a
    build error. Each module keeps a bytes object of its own: joined into one, the pieces would
    leave a hole of the same size below it, which the snapshot would keep as address space
    that no run could have in one piece.
    """
    index = {}
    for name, is_package, path in _sources(root):
        if name in loaded:
            continue
        with open(path, "rb") as f:
            source = f.read()
        code = marshal.dumps(compile(source, path, "exec", dont_inherit=True))
        index[name] = (is_package, zlib.compress(code, 9), path)
        del source, code
    return Store(index)


def install(store):
    """Puts ``store`` on ``sys.meta_path`` after the built-in and frozen importers and before
    the path finder, which finds nothing at run time (the build's directories are gone) after
    asking the file system for each of them."""
    from importlib.machinery import PathFinder

    sys.meta_path.insert(sys.meta_path.index(PathFinder), store)
