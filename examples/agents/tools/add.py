"""The calculator's `add` tool: arguments as JSON on stdin, the sum on stdout."""
import json
import sys

args = json.load(sys.stdin)
print(args["a"] + args["b"])
