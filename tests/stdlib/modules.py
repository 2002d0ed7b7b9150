# Lists the standard library's modules as the guest has them, and imports each: the names of
# sys.stdlib_module_names, then every submodule the guest holds (preloaded, or stored by
# guest-default/python/pycage_stdlib.py). Returns {name: null | {"error": "Type: message", "missing":
# the module a ModuleNotFoundError names, or null}}.
import importlib
import sys

stored = [f for f in sys.meta_path if hasattr(f, "names")]
names = set(sys.stdlib_module_names)
for holder in (list(sys.modules), *(s.names() for s in stored)):
    names.update(n for n in holder if n.partition(".")[0] in sys.stdlib_module_names)
# Importing these has an effect beyond the import (printing the Zen of Python, opening a web
# browser), and their packages' `__main__` runs a command line.
names -= {"this", "antigravity"}
names = sorted(n for n in names if not n.endswith(".__main__"))

result = {}
for name in names:
    try:
        importlib.import_module(name)
        result[name] = None
    except BaseException as e:  # noqa: BLE001 - every failure is the answer
        missing = e.name if isinstance(e, ModuleNotFoundError) else None
        result[name] = {"error": f"{type(e).__name__}: {e}", "missing": missing}
return result
