"""An MCP host no one here wrote (the official Python SDK) using `tiller mcp`.

Starts `TILLER mcp --agents AGENTS` over stdio, lists its tools, calls the
`helper` agent with a question (collecting its progress messages) and with no
`text`, lists its prompts and gets `helper`'s, and prints what it saw as one JSON
object, each result as it was on the wire.
"""

import asyncio
import json
import sys

from mcp import ClientSession, StdioServerParameters, stdio_client


async def main(tiller: str, agents: str) -> None:
    server = StdioServerParameters(command=tiller, args=["mcp", "--agents", agents])
    async with stdio_client(server) as (read, write):
        async with ClientSession(read, write) as session:
            info = await session.initialize()
            listed = await session.list_tools()
            progress: list[str] = []

            async def on_progress(value, total, message):
                progress.append(message or "")

            answered = await session.call_tool(
                "helper", {"text": "hello from MCP"}, progress_callback=on_progress
            )
            refused = await session.call_tool("helper", {})
            prompts = await session.list_prompts()
            prompt = await session.get_prompt("helper")
            wire = lambda model: model.model_dump(by_alias=True, mode="json", exclude_none=True)
            print(
                json.dumps(
                    {
                        "server": wire(info)["serverInfo"]["name"],
                        "tools": [wire(tool) for tool in listed.tools],
                        "answered": wire(answered),
                        "progress": progress,
                        "refused": wire(refused),
                        "prompts": [wire(p) for p in prompts.prompts],
                        "prompt": wire(prompt),
                    }
                )
            )


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
