"""An MCP server built with the official Python SDK (PyPI `mcp`), over stdio,
that behaves as a careless or hostile one may: it reads its environment, floods
its stderr, and takes its time."""

import asyncio
import os
import sys

from mcp.server.mcpserver import MCPServer

server = MCPServer("unruly")


@server.tool()
def variable(name: str) -> str:
    """The value of an environment variable, or `<unset>`."""
    return os.environ.get(name, "<unset>")


@server.tool()
def shout(megabytes: int) -> str:
    """Writes one line of that many MiB to stderr, then bytes that are not
    UTF-8, then more lines, and says done."""
    err = sys.stderr.buffer
    err.write(b"x" * (megabytes << 20) + b"\n")
    err.write(b"\xff\xfe not text \xc3\n")
    for n in range(2000):
        err.write(b"line %d of the flood after it\n" % n)
    err.flush()
    return "done"


@server.tool()
async def dawdle(seconds: float) -> str:
    """Answers after `seconds`."""
    await asyncio.sleep(seconds)
    return "finally"


if __name__ == "__main__":
    server.run("stdio")
