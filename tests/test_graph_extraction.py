"""Offline graph extraction (memory_service.formation.entities) measured on a labelled set.

tests/data/graph_labelled.json holds 60 chat windows written by hand for this project
(no benchmark data): 48 "dev" windows the rules were developed against, 12 "holdout" ones
written after the rules were frozen and scored once. Entities are scored by normalised name (or a labelled alias) and type,
facts by (subject, predicate, object). The thresholds sit just under what the rules
measure (docs/extraction.md, "Entities and facts"); the issue's target is entity precision
>= 0.85.
"""

from __future__ import annotations

import json
import re
import unicodedata
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memory_service.domain.graph import EntityType, ExtractedEntity, ExtractedFact, normalise_name
from memory_service.domain.models import Role
from memory_service.domain.namespaces import Namespace
from memory_service.formation.entities import extract_graph
from memory_service.formation.extractor import Window, WindowMessage

DATA = Path(__file__).parent / "data" / "graph_labelled.json"
WINDOWS: list[dict[str, Any]] = json.loads(DATA.read_text())["windows"]
T0 = datetime(2024, 5, 15, 10, tzinfo=UTC)


def _window(item: dict[str, Any]) -> Window:
    at = datetime.fromisoformat(item["created_at"])
    return Window("agent", "s", tuple(
        WindowMessage(f"{item['id']}-{i}", i, Role(m["role"]), m["user_id"], m["content"], at)
        for i, m in enumerate(item["messages"])))


def _msgs(*pairs: tuple[Role, str, str]) -> Window:
    return Window("agent", "s", tuple(WindowMessage(f"m{i}", i, role, uid, text, T0)
                                      for i, (role, uid, text) in enumerate(pairs)))


class Score:
    def __init__(self) -> None:
        self.tp = self.fp = self.fn = 0

    def add(self, got: set[Any], expected: set[Any]) -> None:
        self.tp += len(got & expected)
        self.fp += len(got - expected)
        self.fn += len(expected - got)

    @property
    def precision(self) -> float:
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else 1.0

    @property
    def recall(self) -> float:
        return self.tp / (self.tp + self.fn) if self.tp + self.fn else 1.0


def _score(split: str | None = None) -> tuple[Score, Score, dict[str, Score], list[tuple[datetime | None, str]]]:
    entities, facts, by_type = Score(), Score(), {t.value: Score() for t in EntityType}
    dates: list[tuple[datetime | None, str]] = []  # (extracted valid_at, labelled) for matched dated facts
    for item in WINDOWS:
        if split is not None and item["split"] != split:
            continue
        got_entities, got_facts = extract_graph(_window(item))
        canon = {normalise_name(a): normalise_name(e["name"]) for e in item["entities"] for a in [e["name"], *e["aliases"]]}

        def c(name: str) -> str:
            return canon.get(normalise_name(name), normalise_name(name))

        expected = {(c(e["name"]), e["type"]) for e in item["entities"]}
        got = {(c(e.name), e.type.value) for e in got_entities}
        entities.add(got, expected)
        for t, score in by_type.items():
            score.add({g for g in got if g[1] == t}, {x for x in expected if x[1] == t})
        labelled = {(c(f["subject"]), f["predicate"], c(f["object"])): f.get("valid_at") for f in item["facts"]}
        extracted = {(c(f.subject), f.predicate, c(f.object)): f.valid_at for f in got_facts}
        facts.add(set(extracted), set(labelled))
        dates += [(extracted[k], v) for k, v in labelled.items() if v and k in extracted]
    return entities, facts, by_type, dates


def test_the_labelled_set_is_large_and_varied() -> None:
    assert len(WINDOWS) >= 40
    types = {e["type"] for w in WINDOWS for e in w["entities"]}
    assert types >= {"person", "place", "organisation", "object", "event"}
    predicates = {f["predicate"] for w in WINDOWS for f in w["facts"]}
    assert predicates >= {"lives_in", "works_at", "married_to", "has_pet", "has_child", "sibling_of", "visited",
                          "likes", "studies_at", "born_in", "is_named"}
    assert sum(1 for w in WINDOWS if not w["facts"]) >= 5  # windows that state nothing
    threads = [w["thread"] for w in WINDOWS]
    assert any(threads.count(t) >= 3 for t in threads)  # facts that change over a user's windows


def test_precision_and_recall_on_the_labelled_set() -> None:
    entities, facts, by_type, dates = _score()
    assert entities.precision >= 0.95  # measured 0.964; the target is 0.85
    assert entities.recall >= 0.87  # measured 0.889
    assert facts.precision >= 0.95  # measured 1.000
    assert facts.recall >= 0.69  # measured 0.713
    assert by_type["person"].precision >= 0.95 and by_type["place"].precision >= 0.88
    assert by_type["organisation"].precision >= 0.95
    matched = [(got, want) for got, want in dates if got is not None and got.date().isoformat() == want]
    assert len(dates) >= 8 and len(matched) / len(dates) >= 0.9  # a stated date becomes valid_at


def test_the_holdout_meets_the_target() -> None:
    entities, facts, _, _ = _score("holdout")
    assert entities.precision >= 0.88  # measured 0.913, blind
    assert entities.recall >= 0.83  # measured 0.857
    assert facts.precision >= 0.95  # measured 1.000
    assert facts.recall >= 0.45  # measured 0.474


def test_namespaces_are_the_speakers_own() -> None:
    for item in WINDOWS:
        window = _window(item)
        entities, facts = extract_graph(window)
        speakers = {m.user_id for m in window.messages if m.role == Role.USER}
        allowed = {str(Namespace.user("agent", u)) for u in speakers}
        assert {e.namespace for e in entities} <= allowed
        assert {e.name for e in entities if e.type == EntityType.PERSON} >= speakers  # speakers are people
        said_by = {m.message_id: m for m in window.messages}
        for fact in facts:
            assert fact.message_ids, fact
            for mid in fact.message_ids:
                message = said_by[mid]
                if message.role == Role.USER:  # a user's statement stays in that user's namespace
                    assert fact.namespace == str(Namespace.user("agent", message.user_id)), (item["id"], fact)


def test_two_users_in_one_window_keep_their_own_facts() -> None:
    window = _msgs((Role.USER, "ana", "I live in Porto and work at Sonae."),
                   (Role.USER, "ben", "I live in Leeds, my sister Kate works at Asda."))
    entities, facts = extract_graph(window)
    by_ns = {(f.subject, f.predicate, f.object): f.namespace for f in facts}
    assert by_ns[("ana", "lives_in", "Porto")] == "user:agent:ana"
    assert by_ns[("ana", "works_at", "Sonae")] == "user:agent:ana"
    assert by_ns[("ben", "lives_in", "Leeds")] == "user:agent:ben"
    assert by_ns[("Kate", "works_at", "Asda")] == "user:agent:ben"
    assert by_ns[("ben", "sibling_of", "Kate")] == "user:agent:ben"
    assert not any(e.namespace.startswith(("shard:", "agent:")) for e in entities)


def test_empty_and_system_only_windows() -> None:
    assert extract_graph(Window("agent", "s", ())) == ([], [])
    window = _msgs((Role.SYSTEM, "", "The user is Brian; he lives in Dublin and works at Google."),
                   (Role.TOOL, "", "Result: Paris, France"))
    assert extract_graph(window) == ([], [])


def test_system_messages_are_ignored_beside_users() -> None:
    window = _msgs((Role.SYSTEM, "", "The user Brian lives in Dublin."), (Role.USER, "bea", "Hi there!"))
    entities, facts = extract_graph(window)
    assert [(e.name, e.type) for e in entities] == [("bea", EntityType.PERSON)] and facts == []


def test_sentence_initial_capitals_and_chat_words_are_not_entities() -> None:
    window = _msgs((Role.USER, "kim", "Great. Tuesday was rough. Honestly, Monday mornings are the worst."),
                   (Role.ASSISTANT, "", "Sorry to hear that! Maybe March will be better. Anything else?"),
                   (Role.USER, "kim", "No. Thanks! I'll call the Dentist at 3. OK, bye."))
    entities, facts = extract_graph(window)
    assert [e.name for e in entities] == ["kim"] and facts == []


def test_negations_questions_and_conditions_state_no_fact() -> None:
    window = _msgs((Role.USER, "kim", "I don't live in Paris anymore."),
                   (Role.ASSISTANT, "", "Do you work at Google? If you liked Dune, try Hyperion."),
                   (Role.USER, "kim", "Do you live in Rome?"))
    _, facts = extract_graph(window)
    assert facts == []


def test_plans_intentions_and_the_future_state_no_fact_and_relations_stay() -> None:
    window = _msgs((Role.USER, "alice", "I'm planning a trip to Lisbon with my friend Bob."),
                   (Role.USER, "alice", "We're moving to Porto next month, and I hope to work at Farfetch."),
                   (Role.USER, "alice", "I want to visit Kyoto. I'd love to study at Kyoto University."),
                   (Role.USER, "alice", "My mum Helen is visiting from Cork next week."),
                   (Role.USER, "alice", "I visited Seville last year, and we moved to Braga in 2021."))
    _, facts = extract_graph(window)
    triples = {(f.subject, f.predicate, f.object) for f in facts}
    # a plan, a hope, a wish and next month are not (yet) a visit, a home or a job
    assert not {t for t in triples if t[2] in ("Lisbon", "Porto", "Farfetch", "Kyoto", "Kyoto University", "Cork")}
    # a relation is a state: Bob is a friend and Helen the mum now; what happened stays a fact
    assert {("alice", "friend_of", "Bob"), ("Helen", "has_child", "alice"), ("alice", "visited", "Seville"),
            ("alice", "lives_in", "Braga")} <= triples


def test_the_demo_conversation_states_no_visit_from_a_plan() -> None:
    data = json.loads((Path(__file__).parents[1] / "memory_service" / "data" / "demo_conversation.json").read_text())
    facts = []
    for session in data["sessions"]:
        window = Window(data["agent_id"], session["session_id"], tuple(
            WindowMessage(f"m{i}", i, Role(role), user, text, T0) for i, (user, role, text) in enumerate(session["messages"])))
        facts += extract_graph(window)[1]
    assert "alice visited Lisbon" not in [f.text for f in facts]
    assert not [f for f in facts if f.predicate == "visited"]  # nobody has been yet: it is all a plan


def test_unicode_names_and_dates() -> None:
    window = _msgs((Role.USER, "zoë", "My partner Núria moved to Zürich on 3 March 2023. I work at Café Ñandú."))
    entities, facts = extract_graph(window)
    assert {(e.name, e.type) for e in entities} >= {("Núria", EntityType.PERSON), ("Zürich", EntityType.PLACE),
                                                    ("Café Ñandú", EntityType.ORGANISATION)}
    triples = {(f.subject, f.predicate, f.object): f for f in facts}
    assert triples[("Núria", "lives_in", "Zürich")].valid_at == datetime(2023, 3, 3, tzinfo=UTC)
    assert ("zoë", "partner_of", "Núria") in triples and ("zoë", "works_at", "Café Ñandú") in triples
    assert all(f.namespace == "user:agent:zoë" for f in facts)


def test_a_very_long_message_is_read_in_bounded_time() -> None:
    filler = "and then we talked about nothing in particular " * 4000  # ~190k characters, one sentence
    window = _msgs((Role.USER, "kim", f"I live in Oslo. {filler}."), (Role.USER, "kim", "My dog Rex. " * 2000))
    started = datetime.now()
    entities, facts = extract_graph(window)
    assert (datetime.now() - started).total_seconds() < 5
    assert ("kim", "lives_in", "Oslo") in {(f.subject, f.predicate, f.object) for f in facts}
    assert len([e for e in entities if e.name == "Rex"]) == 1  # one entity, however often named
    rex = [f for f in facts if f.object == "Rex"]
    assert len(rex) == 1 and len(rex[0].message_ids) == 1


@pytest.mark.parametrize("text", ["", "   ", "?!...", "😄😄😄", "I", "a" * 5000, "A" * 300])
def test_odd_messages_do_not_fail(text: str) -> None:
    entities, facts = extract_graph(_msgs((Role.USER, "kim", text)))
    assert all(isinstance(e, ExtractedEntity) for e in entities) and all(isinstance(f, ExtractedFact) for f in facts)
    assert all(len(e.name) <= 200 for e in entities)


def test_homes_and_jobs_said_as_people_say_them() -> None:
    window = _msgs((Role.USER, "kim", "Home is Graz now, the old flat is gone."),
                   (Role.USER, "ola", "We're renting a tiny flat in Porto until spring."),
                   (Role.USER, "ben", "Got my ID card from Acme Robotics today, I work there now."),
                   (Role.USER, "eve", "I'm on the payroll at Globex since May."))
    _, facts = extract_graph(window)
    stated = {(f.subject, f.predicate, f.object) for f in facts}
    assert {("kim", "lives_in", "Graz"), ("ola", "lives_in", "Porto"), ("ben", "works_at", "Acme Robotics"),
            ("eve", "works_at", "Globex")} <= stated
    assert all(f.text == f"{f.subject} {'lives in' if f.predicate == 'lives_in' else 'works at'} {f.object}"
               for f in facts if f.predicate in ("lives_in", "works_at"))


def test_there_is_not_guessed_across_sentences_or_negated() -> None:
    window = _msgs((Role.USER, "kim", "Acme Robotics called me back. I work there now."),
                   (Role.USER, "ola", "Globex sent an offer, but I don't work there now."))
    _, facts = extract_graph(window)
    assert not [f for f in facts if f.predicate == "works_at"]


def test_leaving_and_transferring_are_stated() -> None:
    window = _msgs((Role.USER, "kim", "I handed in my notice at Globex; the last day is Friday."),
                   (Role.USER, "ola", "I transferred from Bocconi to Trinity College this term."),
                   (Role.USER, "ben", "We moved out of Leeds in May."))
    _, facts = extract_graph(window)
    stated = {(f.subject, f.predicate, f.object) for f in facts}
    assert {("kim", "left", "Globex"), ("ola", "left", "Bocconi"), ("ola", "studies_at", "Trinity College"),
            ("ben", "moved_out_of", "Leeds")} <= stated, stated


def test_an_ampersand_joins_a_name() -> None:
    _, facts = extract_graph(_msgs((Role.USER, "kim", "I started a new job at Marlowe & Finch on Monday!")))
    assert [(f.subject, f.predicate, f.object) for f in facts] == [("kim", "works_at", "Marlowe & Finch")]


@given(st.text(max_size=40) | st.from_regex(r"[a-z0-9_ ]{0,30}", fullmatch=True))
def test_normalise_name_is_its_full_rule_on_any_text(name):
    """The fast path for names in the normal form already gives what the full rule gives."""
    decomposed = unicodedata.normalize("NFKD", name)
    plain = "".join(c for c in decomposed if not unicodedata.combining(c))
    assert normalise_name(name) == " ".join(re.sub(r"[^\w\s]", "", plain.casefold()).split())
    assert normalise_name(normalise_name(name)) == normalise_name(name)
