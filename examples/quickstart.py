# pycage quickstart: this file runs inside the sandbox.
#
#   cargo run -- run examples/quickstart.py --tools examples/tools.toml --allow add --allow word_count
#
# `add` is a built-in host tool (namespace `math`); `word_count` is a command tool declared in
# examples/tools.toml. Both are reached only through pycage's broker. Everything else here is
# plain CPython 3.14 running in WebAssembly: no files, no network, no processes.
import statistics
from collections import Counter

scores = [72, 88, 95, 61, 79]
print(f"median score: {statistics.median(scores)}")

# Tool calls look like ordinary async functions; the host decides which ones exist.
total = 0
for s in scores:
    r = await add(a=total, b=s)
    total = r["sum"]
print(f"total via the host's add tool: {total}")

text = "the quick brown fox jumps over the lazy dog the end"
counts = await word_count(text=text)
print(f"word_count tool says {counts['words']} words")

# What the sandbox is not allowed to do fails cleanly and can be handled.
try:
    open("/etc/passwd").read()
except OSError as e:
    print(f"host files are out of reach: {type(e).__name__}")

# The return value crosses back to the host as JSON.
return {"total": total, "top_word": Counter(text.split()).most_common(1)[0]}
