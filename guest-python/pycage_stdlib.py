"""The standard library beyond the preloaded modules, imported on demand from the snapshot.

componentize-py gives the guest the standard library only at build time: at run time there is
no file system to import from, so a module that was not imported before the snapshot did not
exist. ``build`` compiles every other module of the standard library (``.py`` under the
interpreter's own library, minus what cannot run here, see ``SKIP``) and keeps its code,
marshalled, in one bytes object, with each module's source compressed beside it. ``Store`` is
the finder and loader that imports from them: a module is unmarshalled and run in the run
that imports it. The bytes live in the snapshot (mapped copy-on-write, never written) and are
immutable; nothing is read from any directory, host or guest.

Keep ``SKIP`` in step with the README's list of modules that do not import, which
``tests/stdlib.rs`` checks against the guest.
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

    ``index`` maps a module's name to ``(is_package, code_at, code_len, source_at,
    source_len, origin)``. A module gets the ``__file__`` it would have had on disk (the one
    its code objects name), so tracebacks and ``inspect`` find its source through
    ``get_source``.
    """

    def __init__(self, index, code, source):
        self._index = index
        self._code = code
        self._source = source

    def __contains__(self, name):
        return name in self._index

    def names(self):
        """The names of every module stored."""
        return list(self._index)

    def find_spec(self, name, path=None, target=None):
        entry = self._index.get(name)
        if entry is None:
            return None
        spec = ModuleSpec(name, self, origin=entry[5], is_package=entry[0])
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
        _, at, n, _, _, _ = self._entry(name)
        return marshal.loads(memoryview(self._code)[at : at + n])

    def get_source(self, name):
        _, _, _, at, n, _ = self._entry(name)
        return zlib.decompress(memoryview(self._source)[at : at + n]).decode("utf-8")

    def get_filename(self, name):
        return self._entry(name)[5]

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


# Fixes applied to a module once it has run, so that what cannot work here fails with the
# error that code written for it expects.
_FIXES = {
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
    build error. The pieces are joined once, so the snapshot holds two bytes objects, not
    hundreds.
    """
    index = {}
    code_parts = []
    source_parts = []
    code_at = source_at = 0
    for name, is_package, path in _sources(root):
        if name in loaded:
            continue
        with open(path, "rb") as f:
            source = f.read()
        code = marshal.dumps(compile(source, path, "exec", dont_inherit=True))
        packed = zlib.compress(source, 9)
        index[name] = (is_package, code_at, len(code), source_at, len(packed), path)
        code_parts.append(code)
        source_parts.append(packed)
        code_at += len(code)
        source_at += len(packed)
        del source, code, packed
    code = b"".join(code_parts)
    del code_parts
    source = b"".join(source_parts)
    del source_parts
    return Store(index, code, source)


def install(store):
    """Puts ``store`` on ``sys.meta_path`` after the built-in and frozen importers and before
    the path finder, which finds nothing at run time (the build's directories are gone) after
    asking the file system for each of them."""
    from importlib.machinery import PathFinder

    sys.meta_path.insert(sys.meta_path.index(PathFinder), store)
