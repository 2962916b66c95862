"""Consolidation of directives and suggestions, and the facts cap, on a real FalkorDB."""

from __future__ import annotations

import asyncio
from xml.etree import ElementTree as ET

from memory_service.domain.models import MemoryKind, ShardIn
from memory_service.domain.namespaces import Namespace
from memory_service.formation.consolidation import RuleBasedConsolidator, consolidate, latest_consolidated
from memory_service.formation.steps import form_window
from memory_service.runtime import open_service

from .helpers import msg


async def test_rule_consolidator_puts_newest_first_drops_repeats_and_keeps_the_limit():
    async def merge(previous, items, limit):
        return (await RuleBasedConsolidator().merge(previous, items, limit)).content

    assert await merge(None, ["I like tea.", "I like coffee."], 100) == "- I like coffee.\n- I like tea."
    merged = await merge("- I like coffee.\n- Call me Al.", ["i like COFFEE", "No meetings on Friday."], 100)
    assert merged == "- No meetings on Friday.\n- i like COFFEE\n- Call me Al."
    long = await merge("- old " + "word " * 20, ["new item here"] * 1 + ["another new one"], 8)
    assert long == "- another new one\n- new item here"  # the point that does not fit is dropped, not cut
    assert await merge(None, ["x " * 50], 10) == "- " + "x " * 8 + "x…"  # unless it is the only one


async def record(service, session: str, user: str, texts: list[str], start: int = 0) -> list[str]:
    ids = []
    for i, text in enumerate(texts, start):
        mid = f"{session}-{i}"
        await service.record_message(session, msg("a1", user, text, mid=mid, minute=i))
        ids.append(mid)
    return ids


PREFS = [f"I prefer option {i} for every booking." for i in range(12)]


async def test_directives_are_consolidated_after_five_and_the_block_shows_the_merge(settings):
    settings = settings.model_copy(update={"consolidate_directives_after": 5, "memory_formation_msg_interval": 100})
    async with open_service(settings, run_worker=True) as service:
        await record(service, "c1", "alice", PREFS[:6])
        await service.form_memories("c1")
        ns = Namespace.user("a1", "alice")
        _, backend = await service.agents.backend_for("a1")
        for _ in range(200):
            if await service.state.consolidation_version(str(ns)) == 1:
                break
            await asyncio.sleep(0.05)
        blob = await latest_consolidated(backend, ns.fields[0], ns)
        assert blob is not None and blob.metadata.sequence == 1 and len(blob.metadata.memory_ids) == 6
        assert all(f"option {i}" in blob.content for i in range(6))
        assert await service.state.consolidation_pending(str(ns)) == []

        await record(service, "c1", "alice", PREFS[6:8], start=6)
        await service.form_memories("c1")  # two new directives: below the threshold, shown as they are
        xml = (await service.assemble_memory_context("a1", "alice", "c1")).xml
        user = ET.fromstring(xml).find("UserMemory/User")
        assert "option 0" in user.find("ConsolidatedMemory").text
        assert sorted(d.text for d in user.iter("Directive")) == [PREFS[6], PREFS[7]]


async def test_an_item_pushed_while_a_consolidation_runs_is_never_lost(service):
    """The merge step itself forms another window, whose directives are pushed mid-run."""
    ns = Namespace.user("a1", "alice")
    _, backend = await service.agents.backend_for("a1")
    await record(service, "p1", "alice", PREFS[:4])
    first = await service.formation.windows.claim("p1", 100)
    await form_window(claim=first, agent_id="a1", backend=backend, windows=service.formation.windows,
                      extractor=service.extractor, shards=[])
    merged_ids = await service.state.consolidation_pending(str(ns))
    assert len(merged_ids) == 4
    # The memory block reads the queues of several namespaces in one round trip, each in order.
    assert await service.state.consolidation_pending_many([str(ns), "user:a1:nobody", str(ns)]) == \
        [merged_ids, [], merged_ids]
    assert await service.state.consolidation_pending_many([]) == []
    await record(service, "p2", "alice", PREFS[4:7])

    class FormingWhileMerging(RuleBasedConsolidator):
        async def merge(self, previous, items, word_limit, *, subject=""):
            claim = await service.formation.windows.claim("p2", 100)
            await form_window(claim=claim, agent_id="a1", backend=backend, windows=service.formation.windows,
                              extractor=service.extractor, shards=[])
            return await super().merge(previous, items, word_limit, subject=subject)

    kwargs = dict(namespace=ns, backend=backend, state=service.state, word_limit=400, agent_id="a1")
    outcome = await consolidate(version=0, count=4, consolidator=FormingWhileMerging(), **kwargs)
    assert outcome["consolidated"] and outcome["items"] == 4
    pending = await service.state.consolidation_pending(str(ns))
    assert len(pending) == 3 and not set(pending) & set(merged_ids)  # the three pushed mid-run survive
    blob = await latest_consolidated(backend, ns.fields[0], ns)
    assert blob.metadata.memory_ids == merged_ids

    # A retry of the same run (e.g. after a crash before its answer) changes nothing.
    again = await consolidate(version=0, count=4, consolidator=RuleBasedConsolidator(), **kwargs)
    assert not again["consolidated"]
    assert await service.state.consolidation_pending(str(ns)) == pending
    assert await backend.count(ns.fields[0], ns, [MemoryKind.CONSOLIDATED]) == 1


async def test_concurrent_formations_and_consolidations_lose_no_directive(settings):
    settings = settings.model_copy(update={"consolidate_directives_after": 2, "memory_formation_msg_interval": 100})
    async with open_service(settings, run_worker=True) as service:
        sessions = [f"k{i}" for i in range(6)]
        for i, session in enumerate(sessions):
            await record(service, session, "alice", [f"I prefer hotel {i} {j} near the beach." for j in range(4)])
        await asyncio.gather(*(service.form_memories(s) for s in sessions))
        ns = Namespace.user("a1", "alice")
        _, backend = await service.agents.backend_for("a1")
        for _ in range(400):  # let the consolidation jobs the formations enqueued settle
            pending = await service.state.consolidation_pending(str(ns))
            if len(pending) < 2 and not await service.queue.pool.zcard("memory-service:jobs"):
                break
            await asyncio.sleep(0.05)
        directives = {d.id for d in await backend.recent(ns.fields[0], ns, [MemoryKind.DIRECTIVE], 1000)}
        assert len(directives) == 24
        blobs = await backend.recent(ns.fields[0], ns, [MemoryKind.CONSOLIDATED], 1000)
        merged = [mid for b in blobs for mid in b.metadata.memory_ids]
        assert len(merged) == len(set(merged))  # nothing merged twice
        assert set(merged) | set(pending) == directives and not set(merged) & set(pending)
        assert [b.metadata.sequence for b in blobs] == list(range(1, len(blobs) + 1))


async def test_facts_per_shard_are_capped_oldest_first(settings):
    settings = settings.model_copy(update={"facts_per_shard": 3, "memory_formation_msg_interval": 100})
    async with open_service(settings, run_worker=True) as service:
        await service.put_shard("a1", "travel", ShardIn(name="travel", extraction_focus="flights, trains"))
        texts = [f"The flight number {i} leaves from gate {i} at noon." for i in range(5)]
        await record(service, "f1", "alice", texts[:3])
        await service.form_memories("f1")
        await record(service, "f1", "alice", texts[3:] + ["The train leaves at dawn tomorrow."], start=3)
        await service.form_memories("f1")
        _, backend = await service.agents.backend_for("a1")
        ns = Namespace.shard("a1", "travel")
        facts = await backend.recent(ns.fields[0], ns, [MemoryKind.FACT], 100)
        assert len(facts) == await backend.count(ns.fields[0], ns, [MemoryKind.FACT]) == 3
        assert "train" in facts[-1].content and "number 3" in facts[0].content


async def test_rule_merge_keeps_one_of_two_near_identical_items_and_never_joins_two():
    async def merge(previous, items, limit):
        return (await RuleBasedConsolidator().merge(previous, items, limit)).content

    merged = await merge(None, ["Please always answer in French.", "I prefer aisle seats.",
                                "Always answer in French, please!"], 100)
    # the newer wording of the same point wins; the other point stays its own line
    assert merged.splitlines() == ["- Always answer in French, please!", "- I prefer aisle seats."]
    facts = await merge(None, ["alice plays the clarinet.", "alice plays the clarinet!"], 100)
    assert facts.splitlines() == ["- alice plays the clarinet!"]
    # numbers tell points apart; different points are never one
    assert len((await merge(None, ["I prefer seat 1 on every flight.", "I prefer seat 2 on every flight."], 100))
               .splitlines()) == 2
