"""The recipe's helpers for building CPython extension modules for pycage's wasm guest.

The guest is componentize-py 0.25.1's CPython 3.14 for WASI. Its shared libraries (libc,
libpython, libc++) and its standard library travel inside componentize-py's native module as
zstd frames; an extension module must link against exactly those, so the recipe reads them out
of the wheel it already installs by hash, instead of building another libc. Subcommands:

  libraries WHEEL_LIB OUT_LIB OUT_STDLIB   the guest's shared libraries and standard library
  pyconfig TEMPLATE STDLIB OUT             pyconfig.h for the guest's CPython
  pyinfo STDLIB INCLUDE                    what meson's python_info.py prints, for the guest
  undefined MODULE LIB...                  fails when MODULE imports a symbol no LIB defines
  wheel SDIST SITE OUT WORK                the wheel of SITE's files, for the guest

Written from the WebAssembly binary format and dynamic-linking documents; standard library
only, so that it runs on the build machine's Python before any tool is installed (but
`libraries`, which needs zstandard).
"""

import base64
import hashlib
import importlib
import io
import json
import os
import re
import sys
import tarfile
import zipfile

SYSCONFIGDATA = "_sysconfigdata__wasi_wasm32-wasi"

# The wheels' tags: CPython 3.14's ABI, on a platform tag no other project's wheel carries.
# Another CPython for WASI (another libc, other flags) could not load these modules, and this
# guest could not load another's: `pycage guest build` asks pip for exactly this platform.
WHEEL_TAG = "cp314-cp314-pycage_wasm32"

# The guest's libraries this recipe links against, by a symbol only that library exports, and
# their SHA-256 as componentize-py 0.25.1 carries them: a different componentize-py fails
# here, before anything is built against the wrong libraries.
LIBRARIES = {
    "libpython3.14.so": (
        "Py_Initialize",
        "0ab4ec14447dc6a983de96b294d904a9a2b77126a1b96ff1a6ae340c72405549",
    ),
    "libc.so": ("printf", "f1b113e24a8c7774f361d7318ababd98124f3b75889f8b5fc0ab10f97c17e42d"),
    "libc++abi.so": (
        "__cxa_demangle",
        "f93f92bc4fa31c3ccf86a140e1ba68254b5a937434b41fa0ba8b7feefa7d0e0e",
    ),
    "libc++.so": (
        "_ZNKSt3__212basic_stringIcNS_11char_traitsIcEENS_9allocatorIcEEE13find_first_ofEPKcmm",
        "65a44e3f7ad79ff246b82b61782789a35d0683f56f823cca22496fd6d597b9f3",
    ),
}


def _leb(b, i):
    result = shift = 0
    while True:
        byte = b[i]
        i += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return result, i


def _name(b, i):
    n, i = _leb(b, i)
    return b[i : i + n].decode(), i + n


def _limits(b, i):
    flags, i = _leb(b, i)
    _, i = _leb(b, i)
    if flags & 1:
        _, i = _leb(b, i)
    return i


def imports_exports(module):
    """A core module's imports, as ``(module, name)``, and the set of its export names."""
    if module[:4] != b"\0asm":
        raise ValueError("not a WebAssembly module")
    imports, exports = [], set()
    i = 8
    while i < len(module):
        section = module[i]
        size, start = _leb(module, i + 1)
        body = module[start : start + size]
        i = start + size
        if section == 2:
            count, j = _leb(body, 0)
            for _ in range(count):
                mod, j = _name(body, j)
                field, j = _name(body, j)
                kind = body[j]
                j += 1
                if kind == 0:  # function: type index
                    _, j = _leb(body, j)
                elif kind == 1:  # table: reference type, limits
                    j = _limits(body, j + 1)
                elif kind == 2:  # memory: limits
                    j = _limits(body, j)
                elif kind == 3:  # global: value type, mutability
                    j += 2
                else:  # tag: attribute, type index
                    _, j = _leb(body, j + 1)
                imports.append((mod, field))
        elif section == 7:
            count, j = _leb(body, 0)
            for _ in range(count):
                field, j = _name(body, j)
                _, j = _leb(body, j + 1)
                exports.add(field)
    return imports, exports


def libraries(wheel_lib, out_lib, out_stdlib):
    """Writes the guest's shared libraries (``LIBRARIES``) into ``out_lib`` and its standard
    library into ``out_stdlib``, read from componentize-py's native module."""
    import zstandard

    data = open(wheel_lib, "rb").read()
    found = {}
    stdlib = None
    at = 0
    while (at := data.find(b"\x28\xb5\x2f\xfd", at)) >= 0:
        try:
            frame = zstandard.ZstdDecompressor().decompressobj().decompress(data[at:])
        except zstandard.ZstdError:
            frame = b""
        at += 4
        if frame[:4] == b"\0asm":
            exports = imports_exports(frame)[1]
            for name, (marker, _) in LIBRARIES.items():
                if marker in exports:
                    found.setdefault(name, frame)
                    break
        elif stdlib is None and frame[257:262] == b"ustar":
            with tarfile.open(fileobj=io.BytesIO(frame)) as tar:
                if SYSCONFIGDATA + ".py" in tar.getnames():
                    stdlib = frame
    missing = sorted(set(LIBRARIES) - set(found))
    if missing or stdlib is None:
        sys.exit(f"{wheel_lib}: not found in componentize-py: {missing or 'the standard library'}")
    os.makedirs(out_lib, exist_ok=True)
    for name, frame in found.items():
        digest = hashlib.sha256(frame).hexdigest()
        if digest != LIBRARIES[name][1]:
            sys.exit(
                f"{name}: SHA-256 {digest}, not the {LIBRARIES[name][1]} this recipe was made "
                "for (another componentize-py?)"
            )
        with open(os.path.join(out_lib, name), "wb") as f:
            f.write(frame)
    with tarfile.open(fileobj=io.BytesIO(stdlib)) as tar:
        tar.extractall(out_stdlib, filter="data")


def _guest_vars(stdlib):
    sys.path.insert(0, stdlib)
    return dict(importlib.import_module(SYSCONFIGDATA).build_time_vars)


def pyconfig(template, stdlib, out):
    """pyconfig.h for the guest: every macro of ``template`` (a pyconfig.h of the same CPython
    version, for another platform) defined as the guest's sysconfigdata records it, which is
    how CPython's own build parsed it out of the guest's pyconfig.h (0 there means undefined)."""
    values = _guest_vars(stdlib)
    lines, seen = [], set()
    for line in open(template):
        m = re.match(r"#define ([A-Za-z_][A-Za-z0-9_]*)\b", line) or re.match(
            r"/\* #undef ([A-Za-z_][A-Za-z0-9_]*) \*/", line
        )
        if m is None or (m.group(1).startswith("_") and m.group(1) not in values):
            lines.append(line.rstrip("\n"))
            continue
        name = m.group(1)
        if name in seen:
            continue
        seen.add(name)
        value = values.get(name, 0)
        lines.append(f"/* #undef {name} */" if value in (0, "") else f"#define {name} {value}")
    with open(out, "w") as f:
        f.write("/* Generated by pycage's guest-data recipe from the guest's sysconfigdata. */\n")
        f.write("\n".join(lines) + "\n")


def pyinfo(stdlib, include):
    """Prints what meson's ``python_info.py`` prints, for the guest's CPython: meson runs the
    build machine's Python to learn the target's, and would otherwise build for the wrong one."""
    values = _guest_vars(stdlib)
    values.update(
        INCLUDEPY=include, CONFINCLUDEPY=include, base_prefix="/usr", prefix="/usr", LIBPYTHON=""
    )
    site = "lib/python3.14/site-packages"
    relative = {
        "purelib": site,
        "platlib": site,
        "include": "include/python3.14",
        "platinclude": "include/python3.14",
        "data": "",
        "scripts": "bin",
        "stdlib": "lib/python3.14",
        "platstdlib": "lib/python3.14",
    }
    paths = {k: "/usr/" + p for k, p in relative.items()}
    paths.update(include=include, platinclude=include)
    print(
        json.dumps(
            {
                "variables": values,
                "paths": paths,
                "sysconfig_paths": paths,
                "install_paths": {k: "/" + p for k, p in relative.items()},
                "version": values["VERSION"],
                "platform": "wasi-wasm32",
                "is_pypy": False,
                "is_venv": False,
                "link_libpython": False,
                "suffix": values["EXT_SUFFIX"],
                "limited_api_suffix": ".abi3.so",
                "is_freethreaded": False,
            }
        )
    )


# What a position-independent module imports from its loader rather than from a library.
_LOADER = {"memory", "__indirect_function_table", "__stack_pointer", "__memory_base", "__table_base"}


def undefined(module, libs):
    """Exits 1, naming them, when ``module`` imports a symbol (``env``, ``GOT.mem``,
    ``GOT.func``) that neither it nor any of ``libs`` exports. wasm-ld turns any undefined
    symbol of a shared library into an import, so without this a configure check for a
    function the guest lacks would pass, and the failure would wait for the guest's link."""
    with open(module, "rb") as f:
        imports, have = imports_exports(f.read())
    for lib in libs:
        with open(lib, "rb") as f:
            have |= imports_exports(f.read())[1]
    missing = sorted(
        {
            name
            for mod, name in imports
            if mod in ("env", "GOT.mem", "GOT.func") and name not in _LOADER and name not in have
        }
    )
    if missing:
        sys.exit(f"{module}: undefined symbols: {', '.join(missing)}")


def wheel(sdist, site, out, work):
    """Writes ``{name}-{version}-{WHEEL_TAG}.whl`` into ``out``: the files under ``site`` but
    those in ``tests`` directories (numpy's tests are 17 of its 39 MB; they are Python files,
    and a test run takes them from the same sdist), and a ``.dist-info`` made of the sdist's
    ``PKG-INFO`` and license files. The archive is the
    same bytes for the same files (sorted, fixed times and modes), wherever the recipe's work
    directory ``work`` was: numpy's ``__config__.py`` records the compilers' paths, which
    become ``$WORK/...``."""
    metadata = open(os.path.join(sdist, "PKG-INFO"), "rb").read()
    fields = dict(
        line.split(": ", 1) for line in metadata.decode().splitlines()[:20] if ": " in line
    )
    name, version = fields["Name"], fields["Version"]
    dist_info = f"{name}-{version}.dist-info"
    files = []
    for top, dirs, names in os.walk(site):
        dirs.sort()
        for f in sorted(names):
            path = os.path.join(top, f)
            parts = os.path.relpath(path, site).split(os.sep)
            if "__pycache__" in parts or "tests" in parts[:-1] or f.endswith(".pyc"):
                continue
            data = open(path, "rb").read()
            if f.endswith(".py"):
                data = data.replace(os.fsencode(work.rstrip("/") + "/"), b"$WORK/")
            files.append((os.path.relpath(path, site), data))
    files.append((f"{dist_info}/METADATA", metadata))
    for f in sorted(os.listdir(sdist)):
        path = os.path.join(sdist, f)
        if f.startswith(("LICENSE", "COPYING")) and os.path.isfile(path):
            files.append((f"{dist_info}/licenses/{f}", open(path, "rb").read()))
    files.append(
        (
            f"{dist_info}/WHEEL",
            f"Wheel-Version: 1.0\nGenerator: pycage guest-data recipe\n"
            f"Root-Is-Purelib: false\nTag: {WHEEL_TAG}\n".encode(),
        )
    )
    record = []
    for path, data in files:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist_info}/RECORD,,")
    files.append((f"{dist_info}/RECORD", ("\n".join(record) + "\n").encode()))
    target = os.path.join(out, f"{name}-{version}-{WHEEL_TAG}.whl")
    with zipfile.ZipFile(target + ".part", "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        for path, data in files:
            info = zipfile.ZipInfo(path, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data, compresslevel=9)
    os.replace(target + ".part", target)
    print(f"{target}: sha256 {hashlib.sha256(open(target, 'rb').read()).hexdigest()}")


def main(argv):
    command, args = argv[1], argv[2:]
    if command == "libraries":
        libraries(*args)
    elif command == "pyconfig":
        pyconfig(*args)
    elif command == "pyinfo":
        pyinfo(*args)
    elif command == "undefined":
        undefined(args[0], args[1:])
    elif command == "wheel":
        wheel(*args)
    else:
        sys.exit(f"unknown command {command!r}")


if __name__ == "__main__":
    main(sys.argv)
