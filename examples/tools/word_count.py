#!/usr/bin/env python3
"""A command tool: reads a JSON object on stdin, writes a JSON result on stdout."""
import json
import sys

args = json.load(sys.stdin)
text = args.get("text")
if not isinstance(text, str):
    print("`text` must be a string", file=sys.stderr)
    sys.exit(1)
json.dump({"words": len(text.split()), "lines": text.count("\n") + 1}, sys.stdout)
