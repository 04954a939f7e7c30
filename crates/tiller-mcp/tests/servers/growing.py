"""An MCP server built with the official Python SDK (PyPI `mcp`), over stdio:
it offers `unlock`, which adds the tool `secret` and tells the client its tools
changed."""

from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("growing")


@server.tool()
async def unlock(ctx: Context) -> str:
    """Adds the `secret` tool."""

    def secret() -> str:
        """Tells the secret."""
        return "42"

    server.add_tool(secret)
    await ctx.session.send_tool_list_changed()
    return "unlocked"


if __name__ == "__main__":
    server.run("stdio")
