"""The seeds' idioms in Python: run_until over turns, structured output into a model, tools' schemas from hints."""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import json
from typing import Annotated, Literal, Optional

import pydantic
import pytest

import tiller
from tiller import FauxTurn


def test_run_until_keeps_going_until_the_predicate_accepts_a_turn():
    seen = []

    def finished(turn: tiller.Turn) -> bool:
        seen.append((turn.turn, turn.text, turn.has_tool_calls()))
        return "DONE" in turn.text

    async def main():
        faux = tiller.Faux("Working on it.", "Still going.", "All DONE.")
        async with await tiller.Supervisor.start() as supervisor:
            agent = await supervisor.spawn(model=faux)
            result = await agent.run_until("Do the task.", finished)
        assert result.end == "completed"
        assert result.text == "All DONE."
        nudges = [m["content"][0]["text"] for m in result.messages if m["role"] == "user"][1:]
        assert nudges == ["The task is not finished yet: keep going."] * 2

    asyncio.run(main())
    assert seen == [(1, "Working on it.", False), (2, "Still going.", False), (3, "All DONE.", False)]


def test_stop_when_reads_a_turns_calls_and_results():
    @tiller.tool
    def lookup(key: str) -> str:
        """Look a key up."""
        return f"value of {key}"

    results = []

    def found(turn: tiller.Turn) -> bool:
        if turn.called("lookup"):
            results.append(turn.get_result("lookup")["content"][0]["text"])
            return True
        return False

    async def main():
        faux = tiller.Faux(FauxTurn.tool_call("lookup", {"key": "k"}), "never asked")
        async with await tiller.Supervisor.start() as supervisor:
            agent = await supervisor.spawn(model=faux, tools=[lookup])
            result = await agent.run("Look k up.", stop_when=found)
        assert result.end == "stop_condition"
        assert faux.remaining == 1

    asyncio.run(main())
    assert results == ["value of k"]


class Filter(pydantic.BaseModel):
    field: str
    value: str


class Person(pydantic.BaseModel):
    name: str
    age: int


@dataclasses.dataclass
class City:
    name: str
    population: int


def test_structured_output_into_a_pydantic_model_or_a_dataclass():
    async def main():
        # The last answer lacks `age`, and so do the two it is asked again for (`output_retries`).
        faux = tiller.Faux('{"name": "Ada", "age": 36}', '{"name": "Lyon", "population": 522250}', *['{"name": "Ada"}'] * 3)
        async with await tiller.Supervisor.start() as supervisor:
            agent = await supervisor.spawn(model=faux)
            person = await agent.run("Who wrote the first program?", output=Person)
            city = await agent.run("A city on the Rhône?", output=City)
            # Not what the schema asks: said, and never an instance.
            bad = await agent.run("Again?", output=Person)
        assert person.output == Person(name="Ada", age=36)
        assert city.output == City(name="Lyon", population=522250)
        assert bad.end == "invalid_output" and bad.output is None and bad.output_error is not None

    asyncio.run(main())


class Order(pydantic.BaseModel):
    lines: list[Filter]


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


def test_a_tools_schema_comes_from_its_hints_and_docstring_and_its_arguments_are_typed():
    received = []

    @tiller.tool(name="paint", sequential=True)
    def paint_it(
        color: Color,
        filters: list[Filter],
        mode: Literal["fast", "careful"] = "fast",
        note: Optional[str] = None,
        size: Annotated[int, "In pixels"] = 10,
        ctx: tiller.ToolContext = None,
    ) -> dict:
        """Paint the things that match.

        Longer explanation, still the description.

        Args:
            color: The color to use.
            filters: Which things to paint;
                every filter must match.
            mode: How.

        Returns:
            What was painted.
        """
        received.append((color, filters, mode, note, size, ctx.call_id))
        return {"painted": len(filters)}

    assert paint_it.name == "paint"
    assert paint_it.description == "Paint the things that match.\n\nLonger explanation, still the description."
    schema = paint_it.parameters
    assert schema["required"] == ["color", "filters"]
    assert schema["properties"]["color"] == {"enum": ["red", "blue"], "description": "The color to use."}
    assert schema["properties"]["filters"]["description"] == "Which things to paint; every filter must match."
    assert schema["properties"]["filters"]["items"]["properties"]["field"] == {"title": "Field", "type": "string"}
    assert schema["properties"]["mode"] == {"enum": ["fast", "careful"], "description": "How.", "default": "fast"}
    assert schema["properties"]["note"] == {"type": "string", "default": None}
    assert schema["properties"]["size"] == {"type": "integer", "description": "In pixels", "default": 10}
    assert "ctx" not in schema["properties"]

    async def main():
        faux = tiller.Faux(
            FauxTurn.tool_call("paint", {"color": "blue", "filters": [{"field": "kind", "value": "door"}]}, id="p1"),
            # Not what the schema allows: Tiller refuses it before Python sees it.
            FauxTurn.tool_call("paint", {"color": "green", "filters": []}, id="p2"),
            "Painted.",
        )
        async with await tiller.Supervisor.start() as supervisor:
            agent = await supervisor.spawn(model=faux, tools=[paint_it])
            return await agent.run("Paint the doors blue.")

    result = asyncio.run(main())
    assert received == [(Color.BLUE, [Filter(field="kind", value="door")], "fast", None, 10, "p1")]
    first, second = [m for m in result.messages if m["role"] == "tool_result"]
    assert json.loads(first["content"][0]["text"]) == {"painted": 1}
    assert second["is_error"] and "green" in second["content"][0]["text"]


def test_an_agent_file_gets_its_tools_from_python(tmp_path):
    @tiller.tool
    def weather(city: str) -> str:
        """The weather in a city."""
        return f"Sunny in {city}."

    agent_file = tmp_path / "forecaster.yaml"
    agent_file.write_text(
        "type: object\n"
        "description: Says the weather.\n"
        "json_schema_extra:\n"
        "  kind: agent\n"
        "  name: forecaster\n"
        "  tools:\n"
        "    - name: weather\n"
    )

    async def main():
        faux = tiller.Faux(FauxTurn.tool_call("weather", {"city": "Oslo"}), "It is sunny in Oslo.")
        async with await tiller.Supervisor.start() as supervisor:
            agent = await supervisor.spawn(file=agent_file, model=faux, tools=[weather])
            result = await agent.run("Weather in Oslo?")
            state = await agent.state()
        assert result.text == "It is sunny in Oslo."
        assert [m["content"][0]["text"] for m in result.messages if m["role"] == "tool_result"] == ["Sunny in Oslo."]
        assert state["definition"]["system_prompt"] == "Says the weather."

    asyncio.run(main())


def test_an_agent_from_a_definition_gets_the_tools_it_names_from_python():
    @tiller.tool
    def weather(city: str) -> str:
        """The weather in a city."""
        return f"Sunny in {city}."

    definition = {"system_prompt": "Say the weather.", "tools": ["weather"], "run": {"max_turns": 4}}

    async def main():
        faux = tiller.Faux(FauxTurn.tool_call("weather", {"city": "Oslo"}), "Sunny.")
        async with await tiller.Supervisor.start() as supervisor:
            agent = await supervisor.spawn(definition=definition, model=faux, tools=[weather])
            result = await agent.run("Weather in Oslo?")
            state = await agent.state()
            with pytest.raises(tiller.ConfigError) as missing:
                await supervisor.spawn(definition={"tools": ["weather", "tides"]}, tools=[weather])
        assert result.text == "Sunny."
        assert (state["definition"]["system_prompt"], state["definition"]["run"]["max_turns"]) == ("Say the weather.", 4)
        assert missing.value.kind == "definition" and "tides" in str(missing.value)

    asyncio.run(main())


def test_a_nested_pydantic_model_is_validated_by_one_schema_with_its_definitions_at_the_root():
    received = []

    @tiller.tool
    def place(order: Order) -> str:
        """Place an order."""
        received.append(order)
        return f"{len(order.lines)} lines"

    assert set(place.parameters["$defs"]) == {"Filter"}
    assert place.parameters["properties"]["order"]["properties"]["lines"]["items"] == {"$ref": "#/$defs/Filter"}

    async def main():
        faux = tiller.Faux(
            FauxTurn.tool_call("place", {"order": {"lines": [{"field": "a", "value": "b"}]}}, id="o1"),
            FauxTurn.tool_call("place", {"order": {"lines": [{"field": "a"}]}}, id="o2"),
            "Placed.",
        )
        async with await tiller.Supervisor.start() as supervisor:
            agent = await supervisor.spawn(model=faux, tools=[place])
            return await agent.run("Order.")

    result = asyncio.run(main())
    assert received == [Order(lines=[Filter(field="a", value="b")])]
    first, second = [m for m in result.messages if m["role"] == "tool_result"]
    assert (first["is_error"], first["content"][0]["text"]) == (False, "1 lines")
    assert second["is_error"] and "value" in second["content"][0]["text"]
