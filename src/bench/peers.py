# The peers' side of `pycage bench --peers PYTHON`: run by that Python, it times one snippet
# at a time in each peer sandbox it can import, as the bench asks on stdin, so that the bench
# interleaves the peers' samples with pycage's in one window.
#
# Protocol, one JSON object per line:
#   out, first: {"peers": {name: version}, "missing": {name: why}}
#   in:  {"peer": name, "code": source}
#   out: {"seconds": float} (the peer's own wall time for a fresh run of the snippet, in this
#        process, as a host application sees it) or {"error": text}
#   in:  end of input: the driver closes its peers and exits.
#
# pydantic-monty: its workers pooled (started once, kept warm) and a new session per run: a
# fresh sandbox, as pycage's fresh runs are. eryx (pyeryx) is not driven: it is not on the
# registries this project's machines reach, so no driver for it could be run (scripts/peers).
import json
import sys
import time

runners = {}
versions = {}
missing = {}

try:
    import pydantic_monty

    pool = pydantic_monty.Monty(min_processes=1, max_processes=1)
    pool.__enter__()

    def monty(code):
        out = pydantic_monty.CollectString()
        started = time.perf_counter()
        with pool.checkout() as session:
            session.feed_run(code, print_callback=out)
        return time.perf_counter() - started

    runners["monty"] = monty
    versions["monty"] = pydantic_monty.__version__
except Exception as e:  # an absent or broken peer is reported, not fatal
    missing["monty"] = f"{type(e).__name__}: {e}"


def answer(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


answer({"peers": versions, "missing": missing})
for line in sys.stdin:
    ask = json.loads(line)
    try:
        answer({"seconds": runners[ask["peer"]](ask["code"])})
    except Exception as e:
        answer({"error": f"{type(e).__name__}: {e}"})
if "monty" in runners:
    pool.__exit__(None, None, None)
