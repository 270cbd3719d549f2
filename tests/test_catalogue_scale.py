"""Every face of a gateway selling 3,000 marketplace resources that change at run time (issue 24:
federation imports thousands, reprices and withdraws them while clients read).

One live devnet gateway over tests/test_catalogue_page.py's 3,000 generated resources, plus ids
MCP must rename: the help skill answers a bounded page; MCP `tools/list` pages cover every tool
once, and a registry change between two pages neither repeats nor skips a tool that stays, nor
renames one; the agent card stays small and valid for the A2A SDK, grouping what it leaves out;
the metrics' skill label stays bounded after calls of hundreds of skills. Startup time and sizes
go to test-artifacts/catalogue-scale.txt (bench/scale_catalogue.py measures the rest)."""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.client.card_resolver import parse_agent_card
from a2a.compat.v0_3 import types as types_v03
from a2a.utils.proto_utils import validate_proto_required_fields
from mcp import ClientSession, types
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import McpError
from prometheus_client.parser import text_string_to_metric_families

from agent.mcp import face as mcp_face
from agent.observability.metrics import MAX_SKILL_LABELS, OTHER_SKILL, Metrics
from agent.pipeline.catalogue import Catalogue
from skills.help import HELP_PAGE_SIZE
from skills.registry import SkillRegistry
from skills.skill import Skill, SkillResult
from tests.support.live_server import CLIENT_TLS, LiveServer, start_server
from tests.support.reports import report
from tests.test_catalogue_page import CATEGORIES, GENERATED, NEEDLE, _write_resources
from wellknown import agent_card
from wellknown.catalogue_page import mcp_tool

# Ids MCP cannot take as they are, or that a registry-order rename would let collide: a federated
# id's form (dots, longer than 64), a model operation tool's name, an id that looks renamed, and a
# dotted id whose plain rename is another resource's id (PLAIN).
RENAMED = ("alpha.beta", "x402.api-example-com.v1-weather-forecast-daily-by-city-and-country-with-extras."
           "0123456789", "embeddings", "sha-0123456789ab")
PLAIN = ("alpha_beta",)
ODD = "Odd"  # their category
CARD_BYTES = 128 * 1024  # measured ~70 KB: 200 skills of ~330 bytes, 7 category entries
HELP_BYTES = 64 * 1024  # measured ~33 KB: 200 skills with their examples


def write_catalogue(folder: Path) -> int:
    """tests/test_catalogue_page.py's 3,000 generated resources and its nasty one, plus RENAMED
    and PLAIN; returns how many files were written."""
    _write_resources(folder)
    for skill_id in (*RENAMED, *PLAIN):
        (folder / f"{skill_id}.json").write_text(json.dumps({
            "id": skill_id, "name": f"Odd {skill_id[:20]}", "description": f"An id MCP renames: {skill_id}",
            "categories": [ODD], "price": "0.002", "method": "POST", "kind": "python",
            "handler": "skills.resources.token_count",
            "input_schema": {"type": "object", "properties": {"text": {"type": "string"},
                                                              "model": {"type": "string"}}},
            "examples": [{"text": "odd", "model": "gpt-4o"}],
        }))
    return GENERATED + 1 + len(RENAMED) + len(PLAIN)


@pytest.fixture(scope="module")
def scale(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    folder = tmp_path_factory.mktemp("scale-resources")
    files = write_catalogue(folder)
    started = time.perf_counter()
    live = start_server(tmp_path_factory.mktemp("scale"), env={
        "PAYWIRE_RESOURCE_DIRS": str(folder),
        "LOCAL_LLM_BASE_URL": "http://127.0.0.1:9/v1",  # the local/* models count as available
    }, startup_timeout=120)
    report("catalogue-scale", f"server start with {files} extra resources: "
                              f"{time.perf_counter() - started:.2f} s")
    yield live
    live.stop()


@asynccontextmanager
async def mcp_session(live: LiveServer) -> AsyncIterator[ClientSession]:
    async with streamable_http_client(f"{live.url}/mcp") as (read, write, _), \
            ClientSession(read, write) as mcp:
        await mcp.initialize()
        yield mcp


async def walk(mcp: ClientSession, cursor: str | None = None) -> list[types.Tool]:
    """Every tool from `cursor` on, page by page; no page longer than TOOLS_PER_PAGE."""
    tools: list[types.Tool] = []
    while True:
        page = await mcp.list_tools(cursor=cursor) if cursor else await mcp.list_tools()
        assert len(page.tools) <= mcp_face.TOOLS_PER_PAGE
        tools += page.tools
        cursor = page.nextCursor
        if cursor is None:
            return tools


def by_skill(tools: list[types.Tool]) -> dict[str, str]:
    """skill id -> tool name, for the tools that call one skill (not the model tools)."""
    return {t.meta["paywire/skill"]: t.name for t in tools if "paywire/skill" in (t.meta or {})}


async def help_answer(mcp: ClientSession, arguments: dict[str, Any]) -> dict[str, Any]:
    result = await mcp.call_tool("help", arguments)
    assert not result.isError and result.structuredContent is not None, result
    assert len(result.content[0].text.encode()) < HELP_BYTES  # type: ignore[union-attr]
    return result.structuredContent


def for_sale(live: LiveServer) -> list[str]:
    return [s.id for s in live.runtime.gateway.catalogue.for_sale() if s.id != "help"]


# -- naming: one rule, from the id alone ------------------------------------------------------------

def test_a_tool_name_is_derived_from_its_skill_id_alone_and_the_page_shows_it() -> None:
    operations = ["chat.completions", "embeddings", "images.edits", "audio.speech"]
    reserved = mcp_face.reserved_names(operations)
    assert reserved == {"chat_completions", "embeddings", "audio_speech"}  # uploads are REST only
    ids = [*RENAMED, *PLAIN, "gen-0001", "token-count-508", "help", "a" * 64, "a" * 65, "x.y.z",
           "chat_completions", "images_edits", "sha-0123456789AB", "Ünïcode", "trailing\n"]
    names = {skill_id: mcp_face.tool_name(skill_id, reserved) for skill_id in ids}
    for skill_id, name in names.items():
        assert re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", name), name
        # the catalogue page shows what MCP gives (the two faces may not import each other)
        assert mcp_tool(skill_id, "resource", None, operations) == name, skill_id
    assert len(set(names.values())) == len(ids)
    kept = {"alpha_beta", "gen-0001", "token-count-508", "help", "a" * 64, "images_edits",
            "sha-0123456789AB"}
    assert {i for i, n in names.items() if n == i} == kept
    assert names["alpha.beta"].startswith("alpha_beta-") and len(names["a" * 65]) == 64
    assert names["embeddings"].startswith("embeddings-")  # the model tool keeps its name


# -- help -------------------------------------------------------------------------------------------

async def test_help_answers_a_bounded_page_and_says_how_to_get_the_rest(scale: LiveServer) -> None:
    sold = for_sale(scale)
    assert len(sold) > GENERATED
    async with mcp_session(scale) as mcp:
        first = await help_answer(mcp, {})
        assert [s["skill"] for s in first["skills"]] == sold[:HELP_PAGE_SIZE]
        pages = -(-len(sold) // HELP_PAGE_SIZE)
        assert (first["total"], first["page"], first["pages"]) == (len(sold), 1, pages)
        assert first["next"] == {"skill": "help", "input": {"page": 2}}
        assert f"paywire sells {len(sold)} skills" in first["text"]
        assert 'send input {"page": 2}' in first["text"]
        assert first["catalogue"].endswith("/api/marketplace/apis")
        # every page in turn: every skill for sale exactly once
        listed, answer = [], first
        while True:
            listed += [s["skill"] for s in answer["skills"]]
            if "next" not in answer:
                break
            answer = await help_answer(mcp, answer["next"]["input"])
        assert listed == sold
        # narrowed: by words (in ids, names, descriptions) and by category, case aside
        found = await help_answer(mcp, {"query": NEEDLE.upper()})
        assert {s["skill"] for s in found["skills"]} == {f"gen-{i:04d}" for i in range(0, GENERATED, 97)}
        assert found["total"] == 31 and "next" not in found
        odd = await help_answer(mcp, {"category": ODD.lower()})
        assert {s["skill"] for s in odd["skills"]} == {*RENAMED, *PLAIN}
        price = {s["skill"]: s["price_usd"] for s in odd["skills"]}
        assert set(price.values()) == {"0.002"}
        past = await help_answer(mcp, {"page": 999})
        assert past["skills"] == [] and "page 999 is past the last" in past["text"]
        wrong = await mcp.call_tool("help", {"page": "two"})
        assert wrong.isError and wrong.structuredContent["error"]["param"] == "page"  # type: ignore[index]


# -- MCP tools/list ---------------------------------------------------------------------------------

async def test_tools_list_pages_cover_every_tool_exactly_once(scale: LiveServer) -> None:
    catalogue = scale.runtime.gateway.catalogue
    async with mcp_session(scale) as mcp:
        tools = await walk(mcp)
        with pytest.raises(McpError, match="cursor"):
            await mcp.list_tools(cursor="999999")
        with pytest.raises(McpError, match="cursor"):
            await mcp.list_tools(cursor="A" * 200)
    names = [t.name for t in tools]
    assert len(names) == len(set(names)) and names[0] == "help"
    skills = by_skill(tools)
    assert set(skills) == {s.id for s in catalogue.for_sale() if s.kind != "model"}
    operations = [t for t in tools if "paywire/operation" in (t.meta or {})]
    assert len(tools) == len(skills) + len(operations) and len(tools) > GENERATED
    # help, the model tools, then the rest, each by name: the order a cursor names a place in
    assert names[1:len(operations) + 1] == sorted(t.name for t in operations)
    assert names[len(operations) + 1:] == sorted(names[len(operations) + 1:])
    # the renamed ones, as the catalogue page shows them
    async with httpx.AsyncClient(base_url=scale.url, verify=CLIENT_TLS) as http:
        for skill_id in (*RENAMED, *PLAIN):
            detail = (await http.get(f"/catalogue/skills/{skill_id}")).json()
            assert detail["mcp_tool"] == skills[skill_id], skill_id
    assert {skills[i] == i for i in RENAMED} == {False} and skills["alpha_beta"] == "alpha_beta"


async def test_a_registry_change_between_pages_neither_repeats_nor_skips_a_tool(scale: LiveServer) -> None:
    registry = scale.runtime.gateway.registry
    async with mcp_session(scale) as mcp:
        before = await walk(mcp)
        names = by_skill(before)
        first = await mcp.list_tools()
        second = await mcp.list_tools(cursor=first.nextCursor)
        seen = [t.name for t in first.tools + second.tools]
        seen_skills = set(by_skill(first.tools + second.tools))
        later = [i for i in names if i not in seen_skills and i.startswith("gen-")]
        gone_seen = second.tools[-1].meta["paywire/skill"]  # the tool the cursor names
        gone_later, repriced = later[100], later[200]  # not listed yet
        added = dataclasses.replace(registry.get(later[0]), id="gen-zz-added")  # type: ignore[arg-type]
        removed = {i: registry.get(i) for i in (gone_seen, gone_later, "alpha_beta")}
        old = registry.get(repriced)
        assert old is not None and old.price_usd is not None
        try:
            for skill_id in removed:  # alpha_beta: its dotted twin alpha.beta keeps its name
                assert registry.remove(skill_id) is not None
            registry.replace(dataclasses.replace(old, price_usd=old.price_usd + Decimal("0.5")))
            registry.add(added)
            rest = await walk(mcp, second.nextCursor)  # the table is rebuilt under the cursor
            after = await walk(mcp)
        finally:
            registry.replace(old)
            registry.remove(added.id)
            for skill in removed.values():
                registry.add(skill)  # type: ignore[arg-type]
    paged = seen + [t.name for t in rest]
    assert len(paged) == len(set(paged))  # nothing twice
    expected_rest = [t.name for t in before if t.name not in seen and t.name not in
                     {names[gone_later], names["alpha_beta"]}] + [added.id]
    assert sorted(t.name for t in rest) == sorted(expected_rest)  # nothing skipped
    assert names[gone_seen] in seen and names[gone_later] not in paged
    survivors = by_skill(after)
    assert set(survivors) == set(names) - set(removed) | {added.id}
    assert all(survivors[i] == names[i] for i in names if i in survivors)  # nobody renamed
    repriced_tool = next(t for t in rest if t.name == names[repriced])
    assert repriced_tool.meta["paywire/price"]["price"]["usd"] == str(old.price_usd + Decimal("0.5"))


# -- the agent card ---------------------------------------------------------------------------------

async def test_the_agent_card_stays_small_valid_and_groups_what_it_leaves_out(scale: LiveServer) -> None:
    cap = scale.runtime.settings.card_max_skills
    catalogue = scale.runtime.gateway.catalogue
    sold = for_sale(scale)
    async with httpx.AsyncClient(base_url=scale.url, verify=CLIENT_TLS) as http:
        served = await http.get(agent_card.CARD_PATH)
        legacy = await http.get(agent_card.LEGACY_CARD_PATH)
    report("catalogue-scale", f"agent card with {len(sold)} skills for sale: {len(served.content):,} bytes "
                              f"(0.3: {len(legacy.content):,})")
    assert len(served.content) < CARD_BYTES and len(legacy.content) < CARD_BYTES
    card = parse_agent_card(served.json())  # the SDK's client reads it
    validate_proto_required_fields(card)
    types_v03.AgentCard.model_validate(legacy.json())
    entries = [s.id for s in card.skills]
    groups = [s for s in card.skills if s.id.startswith(agent_card.CATEGORY_ID_PREFIX)]
    assert entries == ["help", *sold[:cap], *(g.id for g in groups)]
    assert f"lists {cap} of the {len(sold)} skills; {len(sold) - cap} more" in card.description
    # one entry per category of the skills left out (each counted under its first category)
    left_out: dict[str, set[str]] = {}
    for skill_id in sold[cap:]:
        skill = catalogue.get(skill_id)
        assert skill is not None
        left_out.setdefault(skill.categories[0].lower(), set()).add(skill_id)
    assert len(groups) == len(left_out) <= agent_card.MAX_CATEGORY_ENTRIES
    assert {*(c.lower() for c in CATEGORIES), "test", ODD.lower()} <= set(left_out)
    # each one's example is the help call listing its skills, as many as its name says
    async with mcp_session(scale) as mcp:
        for group in groups:
            [example] = group.examples
            call = json.loads(example)
            assert call["skill"] == "help" and set(call["input"]) == {"category"}
            category = call["input"]["category"]
            count = len(left_out[category.lower()])
            assert group.name == f"{category}: {count} more skill{'s' if count > 1 else ''}"
            listed, answer = set(), await help_answer(mcp, call["input"])
            while True:
                listed |= {s["skill"] for s in answer["skills"]}
                if "next" not in answer:
                    break
                answer = await help_answer(mcp, answer["next"]["input"])
            assert left_out[category.lower()] <= listed, category


def test_a_card_entry_and_the_groups_are_bounded_whatever_the_skills_say() -> None:
    async def run(payload: dict[str, Any]) -> SkillResult:
        return SkillResult(body={})

    registry = SkillRegistry()
    registry.add(Skill(id="wordy", name="N" * 500, description="D" * 5000, run=run,
                       categories=tuple(f"Wordy{i}" for i in range(30)), price_usd=Decimal("0.01"),
                       examples=({"text": "x" * 5000},)))
    for i in range(30):  # 30 categories of 3 skills left out, when the card lists none
        for j in range(3):
            category = f"Cat {i:02d}" if i != 1 else "Cat 00!"  # another category, the same slug
            registry.add(Skill(id=f"r-{i}-{j}", name="R", description="R.", categories=(category,),
                               price_usd=Decimal("0.01"), run=run))
    catalogue = Catalogue(registry)
    [_, entry] = agent_card.build_agent_card(catalogue, [], base_url="https://x.test", version="1",
                                             max_skills=1).skills[:2]
    assert entry.id == "wordy" and len(entry.name) == agent_card.MAX_NAME_CHARS
    assert entry.description.endswith("… Price: $0.01 per call (USDC via x402).")
    assert len(entry.description) < agent_card.MAX_DESCRIPTION_CHARS + 50
    assert len(entry.tags) == agent_card.MAX_TAGS and list(entry.examples) == []  # too long to show
    card = agent_card.build_agent_card(catalogue, [], base_url="https://x.test", version="1", max_skills=0)
    groups = card.skills[1:]
    assert len(groups) == agent_card.MAX_CATEGORY_ENTRIES
    assert [g.id for g in groups[:3]] == ["category:cat-00", "category:cat-00-2", "category:cat-02"]
    assert groups[0].name == "Cat 00: 3 more skills"
    assert "category=Cat%2000&page_size=100" in groups[0].description
    assert "91 more are not listed here" in card.description
    assert "; 31 in 11 more categories" in card.description  # past the 20: 10 of 3 skills, wordy's 1


# -- metrics ----------------------------------------------------------------------------------------

def test_the_skill_label_is_bounded_and_federated_resources_count_under_their_source() -> None:
    metrics = Metrics(max_skill_labels=3)
    assert [metrics.skill_label(i) for i in ("a", "b", "a")] == ["a", "b", "a"]
    assert metrics.skill_label("x402.host.one", "federation:host-1") == "federation:host-1"
    assert metrics.skill_label("x402.host.two", "federation:host-1") == "federation:host-1"
    assert metrics.skill_label("c") == OTHER_SKILL  # three values given: a, b, federation:host-1
    assert metrics.skill_label("x402.other.one", "federation:host-2") == OTHER_SKILL
    assert metrics.skill_label("b") == "b" and metrics.skill_label("unknown") == "unknown"


def test_metrics_keep_a_bounded_skill_label_after_calls_of_hundreds_of_skills(scale: LiveServer) -> None:
    registry = scale.runtime.gateway.registry
    template = registry.get("gen-0002")
    assert template is not None
    imported = [dataclasses.replace(template, id=f"x402.seller-example.r{i}.00000000{i:02d}",
                                    source="federation:seller-example-1234abcd") for i in range(3)]
    for skill in imported:
        registry.add(skill)
    quoted = [s.id for s in imported] + [f"gen-{i:04d}" for i in range(MAX_SKILL_LABELS + 50)]
    try:
        with httpx.Client(base_url=scale.url, verify=CLIENT_TLS, timeout=30) as http:
            for skill_id in quoted:  # an unpaid call: quoted (402), counted
                assert http.post(f"/v1/marketplace/api/{skill_id}", json={}).status_code == 402
            scraped = http.get("/metrics").text
    finally:
        for skill in imported:
            registry.remove(skill.id)
    calls = {s.labels["skill"]: s.value for f in text_string_to_metric_families(scraped)
             if f.name == "paywire_calls" for s in f.samples
             if s.name == "paywire_calls_total" and s.labels["outcome"] == "quoted"}
    labels = {s.labels["skill"] for f in text_string_to_metric_families(scraped)
              for s in f.samples if "skill" in s.labels}
    report("catalogue-scale", f"{len(quoted)} skills quoted: {len(labels)} skill label values")
    assert len(labels) <= MAX_SKILL_LABELS + 2  # and "other", "unknown"
    assert calls["federation:seller-example-1234abcd"] == 3
    assert not any(i.startswith("x402.") for i in labels)
    assert calls[OTHER_SKILL] >= 50  # the calls past the cap, each counted
    assert sum(calls.values()) >= len(quoted)
