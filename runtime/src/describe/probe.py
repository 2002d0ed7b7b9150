# The environment probe of `Runner::description` (runtime/src/describe/probe.rs): a fixed
# snippet the host runs once through a runner's backend, to describe what code run there finds.
# Its answer is untrusted data like any guest value: the host keeps only names from its own
# lists and checks every field.
import importlib
import importlib.util
import os
import sys
import warnings

STDLIB = _probe_stdlib
THIRD_PARTY = _probe_third_party
INPUT = _probe_input
OUTPUT = _probe_output


def importable(name):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # 3.11's deprecated modules warn on import
            importlib.import_module(name)
        return True
    except Exception:
        return False


def unavailable_modules():
    """The host's names that this interpreter has in its library and cannot import. `this`
    and `antigravity` do more than import (one prints, one opens a web browser), and Windows'
    own modules are no news elsewhere."""
    skip = {"this", "antigravity"}
    if sys.platform != "win32":
        skip |= {"msvcrt", "nt", "winreg", "winsound", "msilib"}
    names = [m for m in STDLIB if m in sys.stdlib_module_names and m not in skip]
    return [m for m in names if not importable(m)]


def installed(name):
    try:
        return importlib.util.find_spec(name) is not None
    except Exception:
        return False


def starts_process():
    try:
        import subprocess

        subprocess.run([sys.executable or "python3", "-c", ""], capture_output=True, timeout=5)
        return True
    except Exception:
        return False


def starts_thread():
    try:
        import threading

        t = threading.Thread(target=lambda: None)
        t.start()
        t.join()
        return True
    except Exception:
        return False


def has_route():
    # A UDP connect sends nothing: it only asks the kernel for a route (to TEST-NET-1).
    try:
        import socket

        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            s.connect(("192.0.2.1", 9))
            return True
        finally:
            s.close()
    except Exception:
        return False


def working_directory():
    try:
        if os.path.samestat(os.stat("."), os.stat("/work")):
            return "/work"
    except Exception:
        pass
    return os.getcwd()


def writes_file():
    try:
        with open(OUTPUT, "w") as f:
            f.write("probe")
        return True
    except Exception:
        return False


return {
    "python_version": "%d.%d.%d" % sys.version_info[:3],
    "implementation": sys.implementation.name,
    "platform": sys.platform,
    "unavailable_modules": unavailable_modules(),
    "third_party": [m for m in THIRD_PARTY if installed(m)],
    "subprocesses": starts_process(),
    "threads": starts_thread(),
    "network": has_route(),
    "working_directory": working_directory(),
    "sees_input_file": bool(INPUT) and os.path.isfile(INPUT),
    "writes_files": writes_file(),
}
