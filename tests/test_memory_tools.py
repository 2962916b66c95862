"""The memory tools over HTTP (docs/memory-tools.md): get, write, update, soft delete,
undelete, search by tags. A real server, real Redis and FalkorDB, a real worker."""

from __future__ import annotations

import httpx
import pytest

from memory_service.backends.loopback import LoopbackServer
from memory_service.http.app import create_app

from .conftest import flush, suite_settings
from .helpers import wait_embedding_idle
from .store_state import snapshot

AGENT, LOCKED, OTHER = "curator", "locked", "other"
WRITES_OFF = f"memory writes are off for agent '{LOCKED}': the operator turns them on with MEMORY_WRITE_AGENTS"


@pytest.fixture(scope="module")
async def tools_server(falkordb_url):
    settings = suite_settings(falkordb_url, memory_write_agents=[AGENT, OTHER], max_memory_tags=3, max_tag_chars=10,
                              max_message_chars=500, purge_after_days=30)
    async with LoopbackServer(create_app(settings, run_worker=True)) as server:
        yield server


@pytest.fixture
async def http(tools_server, falkordb_url):
    await flush(falkordb_url)
    async with httpx.AsyncClient(base_url=tools_server.base_url, timeout=30) as client:
        yield client


async def record(http, session: str, content: str, agent: str = AGENT, user: str = "alice", mid: str = "m1") -> None:
    answer = await http.post(f"/v1/sessions/{session}/messages", json={
        "agent_id": agent, "user_id": user, "role": "user", "content": content, "message_id": mid})
    assert answer.status_code == 200, answer.text


async def write(http, agent: str = AGENT, **body) -> dict:
    body = {"namespace": f"user:{agent}:alice", "kind": "observation", "content": "Alice keeps a marmoset.", **body}
    answer = await http.post(f"/v1/agents/{agent}/memories", json=body)
    assert answer.status_code == 201, answer.text
    return answer.json()


async def search(http, query: str, agent: str = AGENT, **body) -> list[dict]:
    answer = await http.post(f"/v1/agents/{agent}/search", json={"query": query, **body})
    assert answer.status_code == 200, answer.text
    return answer.json()["results"]


async def context(http, query: str, session: str = "s1") -> str:
    answer = await http.get("/v1/context", params={"agent_id": AGENT, "user_id": "alice", "session_id": session,
                                                   "query": query})
    assert answer.status_code == 200, answer.text
    return answer.json()["xml"]


async def audit(http, action: str, agent: str = AGENT) -> list[dict]:
    answer = await http.get("/v1/audit", params={"agent_id": agent, "action": action})
    assert answer.status_code == 200, answer.text
    return answer.json()["entries"]


async def test_each_tool_over_http(http):
    written = await write(http, title="Pet", tags=["pets", "alice"], confidence=0.8)
    assert written["kind"] == "observation" and written["namespace"] == f"user:{AGENT}:alice"
    assert written["title"] == "Pet" and written["tags"] == ["pets", "alice"] and written["confidence"] == 0.8
    assert written["provenance"]["agent_id"] == AGENT and written["provenance"]["user_id"] == "alice"
    assert written["deleted_at"] is None and written["purge_at"] is None and written["access_count"] == 0
    assert len(written["id"]) == 32
    url = f"/v1/agents/{AGENT}/memories/{written['id']}"

    first = (await http.get(url)).json()
    second = (await http.get(url)).json()
    assert (first["access_count"], second["access_count"]) == (1, 2)
    assert second["last_accessed_at"] >= first["last_accessed_at"] and second["content"] == "Alice keeps a marmoset."

    hits = await search(http, "marmoset")
    assert [(h["id"], h["title"], h["tags"]) for h in hits] == [(written["id"], "Pet", ["pets", "alice"])]
    assert hits[0]["age"] and hits[0]["explanation"]["signals"]

    # A new content is re-indexed: found by its new words (full text and vector), not its old ones.
    updated = await http.patch(url, json={"content": "Alice keeps a chinchilla.", "tags": ["pets"]})
    assert updated.status_code == 200, updated.text
    assert updated.json()["content"] == "Alice keeps a chinchilla." and updated.json()["title"] == "Pet"
    assert updated.json()["tags"] == ["pets"] and updated.json()["updated_at"]
    assert [h["id"] for h in await search(http, "chinchilla")] == [written["id"]]
    assert "fulltext" not in next((h["explanation"]["signals"] for h in await search(http, "marmoset")
                                   if h["id"] == written["id"]), {})
    cleared = await http.patch(url, json={"title": None, "confidence": None})
    assert cleared.json()["title"] is None and cleared.json()["confidence"] is None
    assert cleared.json()["content"] == "Alice keeps a chinchilla."  # fields not given stay

    deleted = await http.delete(url)
    assert deleted.status_code == 200, deleted.text
    dates = deleted.json()
    assert set(dates) == {"id", "deleted_at", "purge_at"} and dates["id"] == written["id"]
    assert dates["purge_at"][:10] > dates["deleted_at"][:10]
    again = await http.delete(url)
    assert again.status_code == 200 and again.json() == dates  # idempotent: the same dates
    assert await search(http, "chinchilla") == []
    shown = (await http.get(url)).json()  # still readable by id, saying it is deleted
    assert shown["deleted_at"] == dates["deleted_at"] and shown["purge_at"] == dates["purge_at"]
    refused = await http.patch(url, json={"content": "Alice keeps a ferret."})
    assert refused.status_code == 409 and "undelete" in refused.json()["detail"]

    back = await http.post(f"{url}/undelete")
    assert back.status_code == 200 and back.json()["deleted_at"] is None and back.json()["purge_at"] is None
    assert [h["id"] for h in await search(http, "chinchilla")] == [written["id"]]
    assert (await http.post(f"{url}/undelete")).status_code == 200  # a live memory is answered as it is

    for action, count in (("memory.write", 1), ("memory.update", 2), ("memory.delete", 1), ("memory.undelete", 1)):
        entries = await audit(http, action)
        assert len(entries) == count, (action, entries)
        assert all(e["target"] == written["id"] for e in entries)
        assert not any(word in str(entries) for word in ("marmoset", "chinchilla", "Pet")), entries
    assert (await audit(http, "memory.update"))[0]["after"]["changed"] == ["confidence", "title"]


async def test_search_by_tags_needs_every_tag_inside_the_store_query(http):
    both = await write(http, content="Trip to Oslo in June.", tags=["travel", "norway"])
    one = await write(http, content="Trip to Rome in May.", tags=["travel"])
    await write(http, content="Trip to Paris in April.")
    assert {h["id"] for h in await search(http, "trip", tags=["travel"])} == {both["id"], one["id"]}
    assert [h["id"] for h in await search(http, "trip", tags=["travel", "norway"])] == [both["id"]]
    assert await search(http, "trip", tags=["norway", "spain"]) == []
    # top_k 1 with a tag: the filter runs inside the store's query, not on the top 1 after it.
    assert [h["id"] for h in await search(http, "trip Paris April", tags=["norway"], top_k=1)] == [both["id"]]
    answer = await http.get("/v1/search", params={"agent_id": AGENT, "query": "trip", "tags": ["norway"]})
    assert [h["id"] for h in answer.json()["results"]] == [both["id"]]


async def test_a_deleted_memory_leaves_the_memory_block_at_once_and_undelete_brings_it_back(http):
    await record(http, "s1", "Hello, I am planning my week.")
    written = await write(http, content="Alice is allergic to hazelnuts.")
    assert "hazelnuts" in await context(http, "hazelnuts allergy")
    assert "hazelnuts" in await context(http, "hazelnuts allergy")  # served from the cache now
    assert (await http.delete(f"/v1/agents/{AGENT}/memories/{written['id']}")).status_code == 200
    assert "hazelnuts" not in await context(http, "hazelnuts allergy")
    assert (await http.post(f"/v1/agents/{AGENT}/memories/{written['id']}/undelete")).status_code == 200
    assert "hazelnuts" in await context(http, "hazelnuts allergy")


async def test_formed_memories_and_messages_can_be_deleted_too(http):
    await record(http, "s1", "My locker code is 4417.")
    [message] = await search(http, "locker code", scope="session", session_id="s1")
    assert message["kind"] == "message"
    assert (await http.delete(f"/v1/agents/{AGENT}/memories/{message['id']}")).status_code == 200
    assert await search(http, "locker code", scope="session", session_id="s1") == []


async def test_a_message_deleted_before_its_window_is_formed_is_left_out_of_it(http):
    # It used to leave the session unformable: formation found the claimed message missing
    # from the store and failed (POST /form 503), again at every retry.
    await record(http, "s1", "My locker code is 4417.", mid="m1")
    await record(http, "s1", "I moved to Porto in March.", mid="m2")
    # The session's other message may come too (the vector signal ranks it, at similarity 0).
    [message] = [h for h in await search(http, "locker code", scope="session", session_id="s1") if "locker" in h["content"]]
    assert (await http.delete(f"/v1/agents/{AGENT}/memories/{message['id']}")).status_code == 200
    formed = await http.post("/v1/sessions/s1/form", params={"wait": "true"})
    assert formed.status_code == 200, formed.text
    assert formed.json()["message_ids"] == ["m1", "m2"]  # the window is done with both
    found = await search(http, "locker code 4417", top_k=50)
    assert not [h for h in found if "4417" in h["content"]]  # nothing formed from the deleted one
    assert {h["kind"] for h in await search(http, "Porto March", top_k=50)} > {"message"}  # the other one is formed
    # A window whose every message was deleted forms nothing, and is formed.
    await record(http, "s2", "My bank PIN is 9931.", mid="m1")
    [alone] = [h for h in await search(http, "bank PIN", scope="session", session_id="s2") if "PIN" in h["content"]]
    assert (await http.delete(f"/v1/agents/{AGENT}/memories/{alone['id']}")).status_code == 200
    formed = await http.post("/v1/sessions/s2/form", params={"wait": "true"})
    assert formed.status_code == 200, formed.text
    assert formed.json()["formed"] and formed.json()["memories"] == {}
    assert not [h for h in await search(http, "bank PIN 9931", top_k=50) if "9931" in h["content"]]
    assert (await http.get("/v1/sessions/s2")).json()["formed_messages"] == 1  # not pending: formed


@pytest.mark.parametrize(("body", "status", "field"), [
    ({"content": ""}, 422, "content"),
    ({"content": "   "}, 422, "content"),
    ({"content": "x" * 501}, 422, "content"),
    ({"tags": ["a", "b", "c", "d"]}, 422, "tags"),
    ({"tags": ["x" * 11]}, 422, "tags[0]"),
    ({"tags": ["ok", " "]}, 422, "tags[1]"),
    ({"tags": [" padded"]}, 422, "tags[0]"),
    ({"tags": ["bell\u0007"]}, 422, "tags[0]"),
    ({"tags": "pets"}, 422, "tags"),
    ({"kind": "message"}, 422, "kind"),
    ({"kind": "consolidated"}, 422, "kind"),
    ({"kind": "gossip"}, 422, "kind"),
    ({"confidence": 1.5}, 422, "confidence"),
    ({"confidence": -0.1}, 422, "confidence"),
    ({"title": ""}, 422, "title"),
    ({"title": "t" * 201}, 422, "title"),
    ({"namespace": "nowhere"}, 422, "namespace"),
    ({"namespace": "user:curator"}, 422, "namespace"),
    ({"namespace": f"user:{OTHER}:alice"}, 404, "namespace"),
    ({"namespace": "session:never-recorded"}, 404, "namespace"),
    ({"namespace": "session:s-other"}, 404, "namespace"),
    ({"surprise": 1}, 422, "surprise"),
    ({"idempotency_key": ""}, 422, "idempotency_key"),
    ({"idempotency_key": "   "}, 422, "idempotency_key"),
    ({"idempotency_key": "k" * 201}, 422, "idempotency_key"),
])
async def test_bad_input_names_the_field_and_stores_nothing(http, falkordb_url, body, status, field):
    await record(http, "s-other", "Someone else's session.", agent=OTHER)
    for agent in (AGENT, OTHER):  # the records' embedding jobs write on their own: let them finish first
        await wait_embedding_idle(falkordb_url, agent)
    before = snapshot(falkordb_url, worker_running=True)
    payload = {"namespace": f"user:{AGENT}:alice", "kind": "observation", "content": "A note.", **body}
    answer = await http.post(f"/v1/agents/{AGENT}/memories", json=payload)
    assert answer.status_code == status, answer.text
    assert answer.json()["detail"].startswith(field) or f"{field}:" in answer.json()["detail"], answer.text
    assert snapshot(falkordb_url, worker_running=True) == before


@pytest.mark.parametrize(("body", "field"), [
    ({"content": None}, "content"),
    ({"content": ""}, "content"),
    ({"content": "x" * 501}, "content"),
    ({"tags": ["a", "b", "c", "d"]}, "tags"),
    ({"kind": None}, "kind"),
    ({"kind": "message"}, "kind"),
    ({"confidence": 7}, "confidence"),
    ({"namespace": f"user:{AGENT}:bob"}, "namespace"),  # a memory does not move
])
async def test_a_bad_update_names_the_field_and_changes_nothing(http, falkordb_url, body, field):
    written = await write(http)
    await http.get(f"/v1/agents/{AGENT}/memories/{written['id']}")
    before = snapshot(falkordb_url, worker_running=True)
    answer = await http.patch(f"/v1/agents/{AGENT}/memories/{written['id']}", json=body)
    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"].startswith(field), answer.text
    assert snapshot(falkordb_url, worker_running=True) == before


async def test_a_write_is_repeatable_with_an_idempotency_key_only(http, falkordb_url):
    plain = [await write(http), await write(http)]  # no key: every write is a new memory, as ever
    assert plain[0]["id"] != plain[1]["id"]
    first = await write(http, content="Alice's marmoset is called Pip.", idempotency_key="turn-7/pip")
    await wait_embedding_idle(falkordb_url, AGENT)
    before = snapshot(falkordb_url, worker_running=True)
    body = {"namespace": f"user:{AGENT}:alice", "kind": "observation", "content": "Alice's marmoset is called Pip.",
            "idempotency_key": "turn-7/pip"}
    again = await http.post(f"/v1/agents/{AGENT}/memories", json=body)
    assert again.status_code == 200 and again.json()["id"] == first["id"], again.text
    assert again.json()["valid_at"] == first["valid_at"]  # the memory stored the first time
    for change in ({"content": "Pip is a parrot."}, {"kind": "fact"}, {"namespace": f"agent:{AGENT}"}):
        reused = await http.post(f"/v1/agents/{AGENT}/memories", json={**body, **change})
        assert reused.status_code == 409 and reused.json()["detail"].startswith("idempotency_key"), reused.text
    assert snapshot(falkordb_url, worker_running=True) == before
    assert len(await audit(http, "memory.write")) == 3  # the repeat is not audited: it changed nothing
    assert [h["id"] for h in await search(http, "marmoset Pip")].count(first["id"]) == 1
    theirs = await write(http, agent=OTHER, content="Alice's marmoset is called Pip.", idempotency_key="turn-7/pip")
    assert theirs["id"] != first["id"]  # a key is the agent's own


async def test_writes_are_off_unless_the_operator_lists_the_agent(http, falkordb_url):
    await record(http, "s-locked", "The vault code is 9931.", agent=LOCKED)
    [message] = await search(http, "vault code", agent=LOCKED)
    url = f"/v1/agents/{LOCKED}/memories"
    assert (await http.get(f"{url}/{message['id']}")).status_code == 200  # reading is not writing
    await wait_embedding_idle(falkordb_url, LOCKED)  # the record's embedding job writes on its own
    before = snapshot(falkordb_url, worker_running=True)
    attempts = [
        ("POST", url, {"namespace": f"user:{LOCKED}:alice", "kind": "observation", "content": "x"}),
        ("PATCH", f"{url}/{message['id']}", {"content": "changed"}),
        ("DELETE", f"{url}/{message['id']}", None),
        ("POST", f"{url}/{message['id']}/undelete", None),
        # Nothing the caller sends turns writes on.
        ("POST", url, {"namespace": f"user:{LOCKED}:alice", "kind": "observation", "content": "x",
                       "memory_write_agents": ["*"]}),
    ]
    for method, target, body in attempts:
        answer = await http.request(method, target, json=body, headers={"X-Memory-Writes": "on"})
        assert answer.status_code in (403, 422), (method, target, answer.text)
        if answer.status_code == 403:
            assert answer.json() == {"detail": WRITES_OFF}
    assert snapshot(falkordb_url, worker_running=True) == before
    assert [h["id"] for h in await search(http, "vault code", agent=LOCKED)] == [message["id"]]


async def test_another_agents_memory_is_answered_as_one_that_does_not_exist(http, falkordb_url):
    theirs = await write(http, agent=OTHER, content="Other agent's secret: the cellar key.")
    await write(http)
    before = snapshot(falkordb_url, worker_running=True)
    answers = {}
    for memory_id in (theirs["id"], "0" * 32):
        url = f"/v1/agents/{AGENT}/memories/{memory_id}"
        for method, target, body in (("GET", url, None), ("PATCH", url, {"content": "mine"}), ("DELETE", url, None),
                                     ("POST", f"{url}/undelete", None)):
            answer = await http.request(method, target, json=body)
            assert answer.status_code == 404, answer.text
            assert "cellar" not in answer.text
            answers.setdefault(method + target.endswith("undelete") * "u", []).append(
                answer.json()["detail"].replace(memory_id, "<id>"))
    assert all(len(set(details)) == 1 for details in answers.values()), answers  # the same answer
    assert snapshot(falkordb_url, worker_running=True) == before
    assert (await http.get(f"/v1/agents/{OTHER}/memories/{theirs['id']}")).json()["deleted_at"] is None
    for bad in ("x" * 65,):
        assert (await http.get(f"/v1/agents/{AGENT}/memories/{bad}")).status_code == 422


async def test_the_python_api(service):
    from memory_service.curation.tools import MemoryUpdate, MemoryWrite
    from memory_service.domain.errors import Forbidden

    service.settings.memory_write_agents = ["py"]
    written = await service.memory_write("py", MemoryWrite(namespace="agent:py", kind="fact", content="Kiwis are birds.",
                                                           tags=["nature"]))
    found = await service.search("py", "kiwis", tags=["nature"])
    assert [r.id for r in found.results] == [written.id]
    updated = await service.memory_update("py", written.id, MemoryUpdate(confidence=0.3))
    assert updated.confidence == 0.3 and updated.content == "Kiwis are birds."
    deleted = await service.memory_delete("py", written.id)
    assert deleted.purge_at is not None and (await service.memory_get("py", written.id)).deleted_at == deleted.deleted_at
    assert (await service.search("py", "kiwis")).results == []
    assert (await service.memory_undelete("py", written.id)).deleted_at is None
    with pytest.raises(Forbidden, match="MEMORY_WRITE_AGENTS"):
        await service.memory_write("elsewhere", MemoryWrite(namespace="agent:elsewhere", kind="fact", content="x"))
