"""The componentize-py entry point of the pycage wasm guest.

componentize-py runs this module's top level at build time and snapshots the interpreter's
heap afterwards, so every module imported here is ready, already initialised, the moment a run
starts. ``PRELOAD`` lists them; the rest of the standard library is kept compiled in the
snapshot and imported on demand (``pycage_stdlib``).
"""

import array
import gc
import importlib
import io
import os
import random
import sys
import types

import pycage_runner
import pycage_stdlib
from componentize_py_types import Err
from wit_world import exports
from wit_world.exports import guest as contract
from wit_world.imports import host

# Marks the table of snapshot objects for the build (`_immortal_table`); four words, so it is
# aligned like the rest of the table. Keep in step with `guest-build/src/snapshot.rs`.
_IMMORTAL_MAGIC = (0x79637970, 0x6D696567, 0x74726F6D, 0x31766C61)

# What `_finish_snapshot` leaves in the snapshot, named here so that assigning them later
# does not grow (and so reallocate, leaving a hole) this module's dict.
_SNAPSHOT_OBJECTS = _IMMORTAL_TABLE = STDLIB = PACKAGES = None

# The plugs (`_plug_free_memory`), in blocks of a list each, every list sized once: a list that
# grows frees its old storage, and a chunk freed after the last plug is a hole a run's first
# objects land in. A block is added when the last is full: the default guest takes one, but a
# custom guest's packages can take more, and how many varies from build to build (builds of
# the same inputs differ): the data guest's last plugging took from 28,747 to over 65,536
# plugs in four builds, and a single list of 65,536 failed one of them.
_PLUG_BLOCK_BITS = 16
_PLUG_BLOCK = 1 << _PLUG_BLOCK_BITS
_PLUGS = [None] * 64
_PLUGS[0] = [None] * _PLUG_BLOCK

# What user code imports for free. Importing at build time costs nothing per run: the snapshot
# holds the initialised modules and each run maps that snapshot copy-on-write. Any other module
# of the standard library is imported in the run that asks for it (``STDLIB``).
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

# A custom guest (`pycage guest build`) says what else to preload, and where its packages
# are while it is built; the default guest has no such module.
try:
    import pycage_guest_config as _config
except ImportError:
    _config = None
PRELOAD_PACKAGES = tuple(getattr(_config, "PRELOAD", ()))
_SITE = getattr(_config, "SITE", None)
for _name in PRELOAD_PACKAGES:
    try:
        importlib.import_module(_name)
    except BaseException as _e:
        # A module asked for that does not import fails the build; `pycage guest build`
        # finds this line in componentize-py's output and reports it.
        raise ImportError(
            f"PYCAGE_PRELOAD_FAILED {_name}: {type(_e).__name__}: {_e}"
        ) from _e

pycage_runner.install_event_loop()


def _write_std_streams_whole():
    """Puts ``sys.stdout`` and ``sys.stderr`` on raw writers that write every byte.

    The host's capturing pipe takes at most 64 KiB per write (that bounds the host's copy of
    a guest buffer), so WASI's ``write`` writes part of a larger buffer and returns the count,
    as POSIX allows. CPython's unbuffered text streams (which the guest's are, so output is
    never held back) ignore that count: ``print("x" * 100_000)`` lost everything past 64 KiB,
    with nothing saying so. These writers loop until the whole buffer is written. A
    ``BufferedWriter`` would loop too, but holds the end of a line until a flush, which a run
    that traps on fuel or time never reaches. Measured in guest fuel: a ``print(i)`` costs
    about 16.1k units instead of 11.3k (plain ``os.write`` calls are unchanged).
    """

    def whole_writer(fd, write=os.write):
        class WholeWrites(io.RawIOBase):
            def writable(self):
                return True

            def fileno(self):
                return fd

            def write(self, data):
                n = write(fd, data)
                if n == len(data):
                    return n
                view = memoryview(data).cast("B")
                while n < len(view):
                    n += write(fd, view[n:])
                return n

        return WholeWrites()

    for name, fd in (("stdout", 1), ("stderr", 2)):
        old = getattr(sys, name)
        new = io.TextIOWrapper(
            whole_writer(fd),
            encoding=old.encoding,
            errors=old.errors,
            line_buffering=old.line_buffering,
            write_through=True,
        )
        setattr(sys, name, new)
        setattr(sys, f"__{name}__", new)


_write_std_streams_whole()


def _interrupt_table():
    """Lets the host interrupt a session's run the way Ctrl-C interrupts a notebook cell.

    Past a session run's deadline the host writes what a SIGINT would have set into this
    instance's memory: the signal's `tripped` flag, the interpreter's `is_tripped`, and the
    signals bit of the main thread's eval breaker. The eval loop then calls the SIGINT handler
    at its next check, which raises ``KeyboardInterrupt`` in the running code (see
    `runtime/src/wasm/interrupt.rs`). The handler is installed here, in the snapshot, because
    componentize-py starts the interpreter without its signal handlers.

    The host finds those places by what it can check: the table below (a magic word pair, the
    interpreter's version, ``NSIG``, the handler's address, the address of ``0``, which is the
    interpreter's SIG_DFL object, and the first word inverted as an end mark) tells it which
    values the signals state holds. Keep in step with that file.

    One word of the table is the guest's: ``_HOLD``, set while an interrupt must wait. That is
    while a tool call is in the host, and once a run's code has failed, while its failure is
    built: both are finished by componentize-py's glue, which calls Python and cannot take an
    exception there (it aborts the guest). The host sends no interrupt while the word is set.
    """
    import signal

    signal.signal(signal.SIGINT, signal.default_int_handler)
    words = (
        *_INTERRUPT_MAGIC,
        sys.hexversion,
        signal.NSIG,
        id(signal.default_int_handler),
        id(0),
        0,
        _INTERRUPT_MAGIC[0] ^ 0xFFFFFFFF,
    )
    return array.array("I", words)


_INTERRUPT_MAGIC = (0x65746E69, 0x70757272)
_INTERRUPT_TABLE = _interrupt_table()
_HOLD = 6


def _reseed_random_lazily():
    """Makes the ``random`` module reseed from the host on first use in each instance.

    The snapshot holds one PRNG state, the same in every instance. componentize-py calls the
    ``random.seed`` it looked up at build time once per instance, before the first run;
    reseeding costs 25-45 µs, so here that call only arms a lazy reseed: the module-level
    functions bound to the shared ``Random`` are removed, and the module's ``__getattr__``
    reseeds it from ``os.urandom`` (the host's entropy) on first use and puts them back.
    ``random.seed(x)`` with a seed seeds at once, as it always does. New
    ``random.Random()`` instances seed themselves from ``os.urandom`` anyway.
    """
    inst = random._inst
    names = [
        n for n in dir(random) if getattr(getattr(random, n), "__self__", None) is inst
    ]

    def restore():
        random.__dict__.pop("__getattr__", None)
        for n in names:
            setattr(random, n, getattr(inst, n))

    def __getattr__(name):
        if name in names:
            inst.seed(os.urandom(32))
            restore()
            return getattr(random, name)
        raise AttributeError(f"module 'random' has no attribute {name!r}")

    def seed(a=None, version=2):
        if a is None and "__getattr__" in random.__dict__:
            return  # already armed: the first use reseeds from the host
        restore()
        inst.seed(a, version)

    seed.__doc__ = inst.seed.__doc__
    for n in names:
        delattr(random, n)
    random.__getattr__ = __getattr__
    random.seed = seed


_reseed_random_lazily()


# What the warm-up runs, the commonest first: a run of `pass` (as componentize-py makes it:
# through `Guest.run`, after calling `random.seed`), print, pycage's tool calls (with a
# stand-in for the host), and the json and re modules.
_WARM_UP_SNIPPETS = (
    "pass",
    "print('hi')",
    "x = base * 2\nreturn x",
    "r = call_tool('add', a=1, b=2)\nreturn r['sum']",
    "r = await add(a=1, b=2)\nreturn [r, {'k': (1, 2.5, None)}]",
    "import json\nreturn json.loads(json.dumps({'a': [1, 2.5, None, 'x']}))",
    # Purged first, so that each round compiles its patterns as a run would.
    "import re\nre.purge()\nm = re.search(r'(\\w+)@([a-z]+)\\.com|\\d{2,4}', 'a@b.com', re.I)\n"
    "return re.findall(r'[a-z]+\\s*', 'one two') + [m.group(1), re.sub('o+', '0', 'foo')]",
    # A run that fails: an exception, and a syntax error.
    "1/0",
    "def f(:",
)

_WARM_UP_REQUEST = (
    '{"vars": {"base": 21}, "tools": [["add", "math.add", "Adds."]], "max_value_bytes": 65536}'
)


def _warm_up(rounds, snippets=_WARM_UP_SNIPPETS):
    """Runs the run path many times before the snapshot is taken.

    CPython specialises bytecode as it runs, writing to the code objects; a fresh instance
    that runs cold code writes (and so copies) every page those code objects live on, on every
    run. Running the path here, where the snapshot still records it, leaves the code
    specialised: a run in a fresh instance then writes far fewer snapshot pages.
    """

    def call(name, args_json):
        return True, '{"sum": 3}'

    guest = Guest()
    for _ in range(rounds):
        for code in snippets:
            try:
                if "call_tool(" in code or "await add(" in code:
                    pycage_runner.run(code, _WARM_UP_REQUEST, call)
                else:
                    random.seed()
                    guest.run(code, _WARM_UP_REQUEST)
            except Err:
                pass  # the snippets that fail
    pycage_runner.linecache.cache.pop(pycage_runner.FILENAME, None)


def _function_code():
    """The code objects that functions run: theirs, and those nested in their constants.

    Collected from the functions rather than by walking every object, whose bookkeeping
    (megabytes, freed again) would leave a hole the plugging then fills for good.
    """
    found = {}
    todo = [f.__code__ for f in gc.get_objects() if type(f) is types.FunctionType]
    while todo:
        c = todo.pop()
        if id(c) not in found:
            found[id(c)] = c
            todo.extend(k for k in c.co_consts if type(k) is types.CodeType)
    return list(found.values())


def _relocate_hot_code():
    """Copies the code objects a warmed-up run still writes to fresh, adjacent memory.

    Some instructions never settle: one that cannot be specialised counts down a backoff
    counter in its code object each time it runs. Those code objects (six on the path of a
    `pass`) lie wherever their modules were imported, each on a page of its own; copied
    together they share a page or two. Found by comparing each code object's bytecode before
    and after two more rounds of each warm-up snippet; the code that creates a function from
    a copied code object (its `co_consts`) is copied too, beside it. Run after the heap has
    been plugged, so the copies come from the top of the heap.
    """
    codes = _function_code()
    # One snippet at a time, the commonest first, so that the code a `pass` writes is copied
    # first, side by side, and so on.
    order = {}
    for snippet in _WARM_UP_SNIPPETS:
        before = [hash(c._co_code_adaptive) for c in codes]
        _warm_up(2, (snippet,))
        for c, b in zip(codes, before):
            if hash(c._co_code_adaptive) != b:
                order.setdefault(id(c), len(order))
        del before
    hot = set(order)
    parent = {}
    for c in codes:
        for k in c.co_consts:
            if type(k) is types.CodeType:
                parent[id(k)] = c
    todo = list(hot)
    while todo:
        child = todo.pop()
        p = parent.get(child)
        if p is not None and id(p) not in hot:
            hot.add(id(p))
            order[id(p)] = order[child]
            todo.append(id(p))
    originals = sorted((c for c in codes if id(c) in hot), key=lambda c: order[id(c)])
    del codes, parent, todo, order
    gc.collect()
    # The search's garbage is freed; with its holes plugged, the copies come from the top.
    _plug_free_memory()
    copies = {}

    def copy(c):
        if id(c) not in copies:
            consts = tuple(
                copy(k) if type(k) is types.CodeType and id(k) in hot else k
                for k in c.co_consts
            )
            copies[id(c)] = c.replace(co_consts=consts)
        return copies[id(c)]

    for c in originals:
        copy(c)
    # The dict every run adds its source to, beside them.
    pycage_runner.linecache.cache = dict(pycage_runner.linecache.cache)
    for f in gc.get_objects():
        if type(f) is types.FunctionType and id(f.__code__) in copies:
            f.__code__ = copies[id(f.__code__)]


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


def _call(name, args_json, table=_INTERRUPT_TABLE, hold=_HOLD):
    # While the call is in the host (and its result in componentize-py's glue), the host holds
    # a session run's interrupt back (see `_interrupt_table`).
    table[hold] = 1
    try:
        return True, host.call_tool(name, args_json)
    except Err as err:
        value = err.value
        return False, (_TOOL_ERROR_KINDS.get(type(value), "failed"), value.value)
    finally:
        table[hold] = 0


# The failure of a run that ran out of memory so far that reporting its failure did too: built
# now, while memory is plentiful. Without it the `MemoryError` escaped `Guest.run`, and
# componentize-py's glue panicked (its message on the run's stderr) and trapped.
_OUT_OF_MEMORY = Err(
    contract.Failure(
        kind=contract.FailureKind.GUEST_EXCEPTION,
        message="MemoryError",
        traceback=None,
        exception="MemoryError",
    )
)


def _reported(error):
    """The `Err` that reports `error`, or `None` when there is no memory to build it."""
    if error is None:
        return None
    try:
        return Err(
            contract.Failure(
                kind=_FAILURE_KINDS[error.kind],
                message=error.message,
                traceback=error.traceback,
                exception=error.exception,
            )
        )
    except MemoryError:
        return None


class Guest(exports.Guest):
    def run(self, code, request_json, table=_INTERRUPT_TABLE, hold=_HOLD):
        table[hold] = 0
        error = None
        try:
            return pycage_runner.run(code, request_json, _call)
        except pycage_runner.Failure as failure:
            # From here on an interrupt would escape into componentize-py's glue: held.
            table[hold] = 1
            error = failure
        except BaseException as exc:  # noqa: BLE001 - escaping here would abort the guest
            table[hold] = 1
            try:
                error = pycage_runner.exception_failure(exc)
            except MemoryError:
                pass
        # Out of the handlers: the exception, its frames and what only they held are released.
        reported = _reported(error)
        if reported is None:
            # Out of memory: what the code left in reference cycles goes only by a collection,
            # run here even when the code turned the collector off. Raising takes memory too.
            gc.collect()
            reported = _reported(error) or _OUT_OF_MEMORY.with_traceback(None)
        raise reported


_warm_up(64)


def _plug_free_memory():
    """Fills the allocator's free chunks, so that what a run allocates comes from fresh memory.

    The interpreter allocates with dlmalloc (no pymalloc in this build), which serves a request
    from the best-fitting free chunk before the top of the heap. Importing and collecting at
    build time leaves about 4.5 MiB of such chunks scattered through the snapshot, so each
    object a run created landed on some snapshot page, and writing it was a copy-on-write
    fault. Held by bytes objects from here on, those chunks stay in the snapshot as data; a
    run's objects are packed at the top of the heap instead, on pages of its own.
    """
    # A request this large fits no free chunk: it comes from the top, and so does any
    # allocation at or above its address.
    top = id(bytes(1 << 20))
    n = _plug_count()
    # Largest first: a big chunk is filled by big plugs, its remainder by smaller ones.
    for size in (65536, 16384, 4096, 1024, 256, 64, 16, 2):
        while True:
            plug = bytes(size)
            if id(plug) >= top:
                break
            _hold_plug(n, plug)
            n += 1
    # The smallest chunks (16 bytes) fit no bytes object; a bare `object()` (8 bytes) fits.
    while True:
        plug = object()
        if id(plug) >= top:
            break
        _hold_plug(n, plug)
        n += 1


def _plug_count():
    """How many plugs are held: the first ones, with no gap between them."""
    n = 0
    for block in _PLUGS:
        if block is None:
            break
        if block[-1] is None:
            return n + block.index(None)
        n += _PLUG_BLOCK
    return n


def _hold_plug(n, plug):
    """Holds `plug` as plug number `n`, adding a block when `n` is past the last.

    With no tuple made and freed on the way (as `divmod` would): the last one freed can stay
    on the interpreter's free list, in a hole, for a run's first tuple to be written to.
    Measured with `divmod` here: fresh `pass` took 290-310 µs at the median against 90-130 µs
    without (`pycage bench --only fresh_pass`, one build of each guest, interleaved).
    """
    at = n >> _PLUG_BLOCK_BITS
    if at == len(_PLUGS):
        raise RuntimeError(f"the heap has more free chunks than {n} plugs can fill")
    if _PLUGS[at] is None:
        _PLUGS[at] = [None] * _PLUG_BLOCK
    _PLUGS[at][n & (_PLUG_BLOCK - 1)] = plug


def _drop_plugs():
    """Lets every plug go, keeping the blocks (reused by the next plugging)."""
    for block in _PLUGS:
        if block is None:
            break
        for i in range(_PLUG_BLOCK):
            block[i] = None


def _immortal_table(objects):
    """Lists the snapshot's objects for the build, which makes them immortal.

    Every reference a run takes to a snapshot object (calling a function, reading a global,
    creating an instance of a class) writes that object's reference count, and each such write
    is a copy-on-write fault on a snapshot page. CPython never writes the count of an immortal
    object (one whose count is at least 2**30 on a 32-bit build). componentize-py offers no
    way to set it from Python, so this records where each object is, and the build (see
    `guest-build/src/snapshot.rs`) sets the counts in the snapshot's data. The record: a magic word, the
    number of objects, then each object's address and its type's address (the build checks
    both before it writes), then the count again, inverted, as an end mark.
    """
    n = len(objects)
    # Allocated once and filled in place: a grown array would leave stale partial copies in
    # freed memory, for the build to find.
    table = array.array("I", bytes(4 * (len(_IMMORTAL_MAGIC) + 2 + 2 * n)))
    at = len(_IMMORTAL_MAGIC)
    for i, word in enumerate(_IMMORTAL_MAGIC):
        table[i] = word
    table[at] = n
    for i, obj in enumerate(objects):
        table[at + 1 + 2 * i] = id(obj)
        table[at + 2 + 2 * i] = id(type(obj))
    table[-1] = n ^ 0xFFFFFFFF
    return table


def _snapshot_objects():
    """Every object the snapshot holds that the collector or its referents can reach.

    The collector's objects are distinct already; only what they refer to outside it (strings,
    numbers, code, untracked containers) needs a record of what was seen, which keeps that
    record small (see `_finish_snapshot`). The collector does not traverse code objects; their
    constants and names are added by hand.
    """
    tracked = gc.get_objects()
    seen = set()
    untracked = []

    def visit(referents):
        for r in referents:
            if not gc.is_tracked(r) and id(r) not in seen:
                seen.add(id(r))
                untracked.append(r)

    for obj in tracked:
        visit(gc.get_referents(obj))
    i = 0
    while i < len(untracked):
        obj = untracked[i]
        i += 1
        visit(gc.get_referents(obj))
        if type(obj) is types.CodeType:
            visit((obj.co_consts, obj.co_names, obj.co_name, obj.co_qualname))
    del seen
    tracked.extend(untracked)
    return tracked


def _store_the_rest_of_the_library():
    """Compiles the modules of the standard library that are not loaded into the store a run
    imports them from (``pycage_stdlib``), and installs it.

    Built here, after everything else the build keeps, it lies above the rest of the
    snapshot. Where it lies decides how many separate regions of the snapshot a fresh run
    writes, and a slot's reset keeps at most 32 of them in place (`runtime/src/wasm/
    engine.rs`): what lies after the last is faulted in again by the next run. Measured as
    page faults per fresh ``pass`` (`pycage bench --only fresh_pass` under `time`, the
    difference between 1,000 and 3,000 runs): 32 before the library was stored; 57 with it
    built before the warm-up; 38 built here largest module first (which packs it 1.5 MiB
    tighter); 16 built here in the order of the library's directories, as now.
    """
    root = os.path.dirname(importlib.import_module("textwrap").__file__)
    store = pycage_stdlib.build(root, sys.modules)
    if len(store.names()) < 200:
        raise RuntimeError(f"only {len(store.names())} modules of the library were stored")
    pycage_stdlib.install(store)
    return store


def _finish_snapshot():
    """Readies the heap for the snapshot, once, as late as possible (`_finish_at_last_lookup`).

    Everything alive now is part of the snapshot every instance starts from. Moving it out of
    the collector's generations means a collection in a run never walks (and so never
    touches, and copies) the snapshot's pages. The objects are listed first, and held from
    here on, so that every address in the table stays the object's.
    """
    global _SNAPSHOT_OBJECTS, _IMMORTAL_TABLE, STDLIB, PACKAGES
    # componentize-py empties both (and refills them from the host in each instance), sys.argv
    # after this point. Emptied here, their contents are freed before the heap is plugged;
    # freed later, they would leave free chunks that a run's first allocations land in.
    os.environ.clear()
    del sys.argv[:]
    STDLIB = _store_the_rest_of_the_library()
    if _SITE is not None:
        import pycage_packages

        PACKAGES = pycage_packages.build(_SITE, sys.modules)
        pycage_packages.install(PACKAGES)
    gc.collect()
    _plug_free_memory()
    _relocate_hot_code()
    _warm_up(64)
    gc.collect()
    # The search's bookkeeping, its result and the table go into the holes the plugs held,
    # not on top of the heap: memory the build takes at its peak stays in every instance as
    # address space a run cannot have in one piece. The search leaves its result above the
    # memory its bookkeeping used; a copy lands in that freed memory, and the original goes
    # back. The holes left over are plugged again below.
    _drop_plugs()
    found = _snapshot_objects()
    _SNAPSHOT_OBJECTS = found.copy()
    del found
    _IMMORTAL_TABLE = _immortal_table(_SNAPSHOT_OBJECTS)
    gc.collect()
    gc.freeze()
    _plug_free_memory()
    # The interpreter keeps up to 100 freed ints for reuse, linked through the ints
    # themselves; the plugging's own ints lie in holes it plugged, where a run's first ints
    # would then be written. Taking more than the list holds empties it.
    _hold_plug(_plug_count(), [(1 << 20) + i for i in range(256)])


def _finish_at_last_lookup():
    """Runs `_finish_snapshot` from the last Python code componentize-py runs at build time.

    After importing this module, componentize-py creates `Guest`, looks up the types it
    converts, empties os.environ, and then looks up `random.seed` (to call it in each new
    instance); what it frees along the way leaves holes. `random.seed` is taken out of the
    module until that lookup, which so reaches the module's `__getattr__`: this one puts
    `seed` and the previous `__getattr__` back and finishes the snapshot.
    """
    seed = random.__dict__.pop("seed")
    previous = random.__getattr__

    def __getattr__(name):
        if name != "seed":
            return previous(name)
        random.seed = seed
        random.__getattr__ = previous
        _finish_snapshot()
        return seed

    random.__getattr__ = __getattr__


_finish_at_last_lookup()
