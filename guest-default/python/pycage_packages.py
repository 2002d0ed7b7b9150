"""Packages baked into a custom guest (``pycage guest build``), kept in the snapshot.

The packages' directory (``site-packages``, mounted at build time only) is gone at run time,
as the standard library's is. ``build`` keeps what a run needs of it in a ``PackageStore``:
the compiled code of every module that was not preloaded (imported on demand, as the
standard library's stored modules are), the build-time path of every extension module (its
code was linked into the guest when it was built, and the guest's ``dlopen`` finds it by that
path, so one that was not preloaded still imports), and every other file (package data, the
distributions' metadata) compressed. The store is also the loader of the preloaded modules of
those packages, so ``importlib.resources`` and ``importlib.metadata`` find their files too.
Nothing is read from any directory at run time.
"""

import errno
import importlib.metadata
import io
import marshal
import os
import posixpath
import sys
import zlib
from importlib.machinery import EXTENSION_SUFFIXES, ExtensionFileLoader, ModuleSpec
from importlib.resources.abc import Traversable, TraversableResources

import pycage_stdlib

# Not kept: bytecode caches, console scripts and the installer's own records.
_SKIP_DIRS = frozenset({"__pycache__", "bin"})
_SKIP_SUFFIXES = (".pyc", ".pyo")


class PackageStore(pycage_stdlib.Store):
    """A ``Store`` of packages: modules, and the files beside them.

    ``index`` maps a module's name to ``(is_package, code, origin)`` where ``code`` is
    ``None`` for a module the snapshot already holds; ``extensions`` maps an extension
    module's name to its build-time path; ``data`` maps a file's build-time path to its
    compressed bytes.
    """

    def __init__(self, index, extensions, data, root):
        super().__init__(index)
        self._extensions = extensions
        self._files = frozenset([*extensions.values(), *(entry[2] for entry in index.values())])
        self._data = data
        self._root = root
        dirs = set()
        paths = [*data, *extensions.values(), *(entry[2] for entry in index.values())]
        for path in paths:
            parent = posixpath.dirname(path)
            while parent.startswith(root) and parent not in dirs:
                dirs.add(parent)
                parent = posixpath.dirname(parent)
        self._dirs = frozenset(dirs)

    def find_spec(self, name, path=None, target=None):
        origin = self._extensions.get(name)
        if origin is not None:
            spec = ModuleSpec(name, ExtensionFileLoader(name, origin), origin=origin)
            spec.has_location = True
            return spec
        entry = self._index.get(name)
        if entry is None or entry[1] is None:
            return None
        return super().find_spec(name, path, target)

    def get_data(self, path):
        blob = self._data.get(posixpath.normpath(path))
        if blob is None:
            raise FileNotFoundError(errno.ENOENT, "not in the guest's packages", path)
        return zlib.decompress(blob)

    def get_resource_reader(self, name):
        entry = self._index.get(name)
        if entry is None or not entry[0]:
            return None
        return _Reader(self, posixpath.dirname(entry[2]))

    def find_distributions(self, context=importlib.metadata.DistributionFinder.Context()):
        wanted = context.name and _normalize(context.name)
        for path in sorted(self._dirs):
            base = posixpath.basename(path)
            if posixpath.dirname(path) != self._root or not base.endswith(".dist-info"):
                continue
            if wanted is None or _normalize(base.partition("-")[0]) == wanted:
                yield _Distribution(self, path)

    def _is_dir(self, path):
        return path in self._dirs

    def _built_from(self, path):
        return path in self._data or path in self._files

    def _children(self, path):
        prefix = path.rstrip("/") + "/"
        names = {
            p[len(prefix) :].partition("/")[0]
            for p in [*self._data, *self._dirs, *(e[2] for e in self._index.values())]
            if p.startswith(prefix)
        }
        return sorted(names)


def _normalize(name):
    return name.lower().replace("-", "_").replace(".", "_")


class _Reader(TraversableResources):
    def __init__(self, store, path):
        self._store = store
        self._path = path

    def files(self):
        return _Entry(self._store, self._path)


class _Entry(Traversable):
    """A file or directory of the stored packages, for ``importlib.resources``."""

    def __init__(self, store, path):
        self._store = store
        self._path = path

    @property
    def name(self):
        return posixpath.basename(self._path)

    def __repr__(self):
        return f"<stored {self._path}>"

    def __fspath__(self):
        return self._path

    def iterdir(self):
        if not self.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, "not a directory", self._path)
        children = self._store._children(self._path)
        return iter([_Entry(self._store, posixpath.join(self._path, n)) for n in children])

    def is_dir(self):
        return self._store._is_dir(self._path)

    def is_file(self):
        return self._path in self._store._data

    def exists(self):
        """Whether the file existed when the guest was built: data, and also modules and
        extension modules, whose bytes live elsewhere (``importlib.metadata.files`` asks)."""
        return self.is_dir() or self._store._built_from(self._path)

    @property
    def parent(self):
        return _Entry(self._store, posixpath.dirname(self._path))

    def joinpath(self, *descendants):
        return _Entry(self._store, posixpath.normpath(posixpath.join(self._path, *descendants)))

    def open(self, mode="r", *args, **kwargs):
        if "w" in mode or "a" in mode or "+" in mode or "x" in mode:
            raise PermissionError(errno.EROFS, "the guest's packages are read-only", self._path)
        data = self.read_bytes()
        stream = io.BytesIO(data)
        return stream if "b" in mode else io.TextIOWrapper(stream, *args, **kwargs)

    def read_bytes(self):
        return self._store.get_data(self._path)


class _Distribution(importlib.metadata.Distribution):
    def __init__(self, store, path):
        self._store = store
        self._path = path

    def read_text(self, filename):
        try:
            return self._store.get_data(posixpath.join(self._path, filename)).decode("utf-8")
        except FileNotFoundError:
            return None

    def locate_file(self, path):
        return _Entry(self._store, posixpath.join(self._root(), str(path)))

    def _root(self):
        return posixpath.dirname(self._path)


def _extension_stem(filename):
    """The module name of an extension module's file name, or None."""
    for suffix in EXTENSION_SUFFIXES:
        if filename.endswith(suffix):
            stem = filename[: -len(suffix)]
            return stem if stem.isidentifier() else None
    return None


def _walk(root):
    """Each file under ``root`` to keep: ``(module name or None, kind, path)``, where kind is
    ``"package"``, ``"module"`` or ``"extension"``."""
    for top, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS)
        rel = os.path.relpath(top, root)
        package = [] if rel == "." else rel.split(os.sep)
        importable = all(part.isidentifier() for part in package)
        for f in sorted(files):
            path = os.path.join(top, f)
            stem, ext = os.path.splitext(f)
            if ext in _SKIP_SUFFIXES:
                continue
            if ext == ".py" and importable and stem.isidentifier():
                if stem == "__init__":
                    if package:
                        yield ".".join(package), "package", path
                    continue
                if stem != "__main__":
                    yield ".".join([*package, stem]), "module", path
                    continue
            extension = _extension_stem(f) if importable else None
            if extension is not None:
                yield ".".join([*package, extension]), "extension", path
                continue
            yield None, None, path


def build(root, loaded):
    """A ``PackageStore`` of what ``root`` (the packages' directory) holds; modules in
    ``loaded`` keep no code, the snapshot has them."""
    index = {}
    extensions = {}
    data = {}
    for name, kind, path in _walk(root):
        if kind == "extension":
            extensions[name] = path
            continue
        is_package = kind == "package"
        if name is None:
            with open(path, "rb") as f:
                data[path] = zlib.compress(f.read(), 9)
            continue
        if name in loaded:
            index[name] = (is_package, None, path)
            continue
        with open(path, "rb") as f:
            source = f.read()
        code = marshal.dumps(compile(source, path, "exec", dont_inherit=True))
        index[name] = (is_package, zlib.compress(code, 9), path)
        del source, code
    return PackageStore(index, extensions, data, root)


def install(store):
    """Puts ``store`` on ``sys.meta_path`` beside the standard library's, and makes it the
    loader of the packages' preloaded modules (their files are gone at run time)."""
    pycage_stdlib.install(store)
    for module in list(sys.modules.values()):
        spec = getattr(module, "__spec__", None)
        if spec is not None and spec.name in store._index:
            spec.loader = store
            module.__loader__ = store
