"""The write-block parser: valid blocks come back exactly; anything else fails the whole
text with an error saying where; no input makes it raise anything else (fuzzed)."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memory_service.curation.write_blocks import (
    MAX_BLOCKS,
    MAX_TAGS,
    TAGS,
    TYPE_WORDS,
    Edge,
    EdgeItem,
    Entity,
    EntityItem,
    GraphPlan,
    Observation,
    ObservationItem,
    WriteBlock,
    WriteBlockError,
    graph_plan,
    parse_write_blocks,
)
from memory_service.domain.graph import EntityType, normalise_name

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "200"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Text a model would write: any Unicode but surrogates, stripped, never empty.
words = st.text(st.characters(exclude_categories=("Cs", "Cc")), min_size=1, max_size=40).map(str.strip).filter(bool)
names = words.filter(lambda w: len(w) <= 200 and bool(normalise_name(w)))
tags = st.lists(words.filter(lambda w: len(w) <= 64), max_size=MAX_TAGS)
types = st.none() | st.sampled_from(list(EntityType))
relations = st.from_regex(r"[a-z][a-z0-9_]{0,20}", fullmatch=True)
two_names = st.tuples(names, names).filter(lambda p: normalise_name(p[0]) != normalise_name(p[1]))
observations = st.builds(Observation, text=words, confidence=st.floats(0, 1), tags=tags, name=st.none() | names)
entities = st.builds(Entity, name=names, type=types, description=st.none() | words)
edges = two_names.flatmap(lambda p: st.builds(Edge, source=st.just(p[0]), target=st.just(p[1]), rel_type=relations,
                                              text=st.none() | words))
items = st.one_of(
    st.builds(EntityItem, kind=st.just("entity"), name=names, type=types, text=st.none() | words, tags=tags),
    st.builds(ObservationItem, kind=st.just("observation"), text=words, name=st.none() | names, tags=tags,
              confidence=st.floats(0, 1)),
    two_names.flatmap(lambda p: st.builds(EdgeItem, kind=st.just("edge"), source=st.just(p[0]), target=st.just(p[1]),
                                          rel_type=relations, confidence=st.floats(0, 1))))
blocks = st.builds(WriteBlock, observations=st.lists(observations, max_size=4), entities=st.lists(entities, max_size=3),
                   edges=st.lists(edges, max_size=3), items=st.lists(items, max_size=4)).filter(lambda b: not b.empty)
# Prose between blocks: no '<' so that it never forms a tag by accident.
prose = st.text(st.characters(exclude_characters="<", exclude_categories=("Cs",)), max_size=60)


def render(block: WriteBlock, tag: str = "memory_write", indent: int | None = None) -> str:
    return f"<{tag}>{json.dumps(block.model_dump(mode='json'), ensure_ascii=False, indent=indent)}</{tag}>"


@FUZZ
@given(st.lists(st.tuples(prose, blocks, st.sampled_from(TAGS), st.sampled_from([None, 2])), max_size=4), prose)
def test_valid_blocks_come_back_exactly_whatever_surrounds_them(parts, tail):
    text = "".join(before + render(block, tag, indent) for before, block, tag, indent in parts) + tail
    parsed = parse_write_blocks(text)
    assert [(p.block, p.tag) for p in parsed] == [(block, tag) for _, block, tag, _ in parts]


@FUZZ
@given(st.text(max_size=300) | st.lists(st.sampled_from([*(f"<{t}>" for t in TAGS), *(f"</{t}>" for t in TAGS),
                                                         '{"observations": [{"text": "x"}]}', "{", "}", "[", "\"",
                                                         "NaN", "\\ud800", "\n", "x"]), max_size=30).map("".join))
def test_any_text_parses_or_fails_with_a_write_block_error(text):
    try:
        parse_write_blocks(text)
    except WriteBlockError as exc:
        assert str(exc) and len(str(exc)) < 500  # a sentence, never an echo of the input


@FUZZ
@given(blocks, st.data())
def test_a_corrupted_block_fails_the_whole_text(block, data):
    good = render(block)
    body_start, body_end = len("<memory_write>"), len(good) - len("</memory_write>")
    cut = data.draw(st.integers(body_start, body_end - 1))
    corrupted = good[:cut] + data.draw(st.sampled_from(["", "{", "]", ",", "\"", "NaN"])) + good[cut + 1:]
    text = render(block) + "\n" + corrupted
    try:
        parsed = parse_write_blocks(text)
    except WriteBlockError as exc:
        assert "block 2" in str(exc) or "line 2" in str(exc)  # the second block is the bad one
    else:  # the change kept it valid (e.g. a character of a string replaced): both blocks came back
        assert len(parsed) == 2


@pytest.mark.parametrize("text,where", [
    ('x\n  <memory_write>{"observations": [{"text": "a", "confidence": 2}]}</memory_write>',
     "block 1 (<memory_write> at line 2, column 3): observations[0].confidence"),
    ('<memory_write>{"observations": [{"text": "a"}], "mood": "happy"}</memory_write>', "block 1 (<memory_write> at line 1, column 1): mood"),
    ('<shadow_write>{"edges": [{"source": "a", "target": "b"}]}</shadow_write>', "edges[0].rel_type"),
    ('<memory_write>{"observations": [{"text": "a"}]}</memory_write>\n<memory_write>{"observations": [{"text": ""}]}'
     '</memory_write>', "block 2 (<memory_write> at line 2, column 1): observations[0].text"),
    ('<memory_write>{"observations": [{"text": "a", "tags": ["' + "t" * 65 + '"]}]}</memory_write>', "tags[0]"),
    ('<memory_write>{"observations": [{"text": "a",}]}</memory_write>', "not JSON: Expecting property name"),
    ('<memory_write>{"observations": [{"text": "a"}]}', "line 1, column 1: <memory_write> is never closed"),
    ('<memory_write>{}</shadow_write>', "closes the <memory_write> block"),
    ('<memory_write> <memory_write>', "blocks do not nest"),
    ('</memory_write>', "closes no block"),
    ('<memory_write>{"observations": [{"text": "a", "confidence": NaN}]}</memory_write>', "NaN"),
    ('<memory_write>{"observations": [{"text": "a", "confidence": true}]}</memory_write>', "confidence"),
    ('<memory_write>{"entities": [{"name": "a", "kind": "x"}]}</memory_write>', "entities[0].kind"),
    ('<memory_write>{"observations": []}</memory_write>', "writes nothing"),
    ('<memory_write>"just text"</memory_write>', "a block holds a JSON object"),
])
def test_a_malformed_block_says_where(text, where):
    with pytest.raises(WriteBlockError) as caught:
        parse_write_blocks(text)
    assert where in str(caught.value)


def test_limits_and_shorthands():
    assert parse_write_blocks("no blocks here <b>bold</b>") == []
    one = '<memory_write>{"entities": ["Alice"]}</memory_write>'
    assert parse_write_blocks(one)[0].block.entities == [Entity(name="Alice")]
    assert parse_write_blocks(one * MAX_BLOCKS)
    with pytest.raises(WriteBlockError, match=f"more than {MAX_BLOCKS} write blocks"):
        parse_write_blocks(one * (MAX_BLOCKS + 1))
    many = json.dumps({"observations": [{"text": "a"}] * 101})
    with pytest.raises(WriteBlockError, match="observations"):
        parse_write_blocks(f"<memory_write>{many}</memory_write>")



UNIFIED = [{"kind": "entity", "name": "Lyon", "type": "City", "text": "a city in France", "confidence": 0.9},
           {"kind": "observation", "name": "Alice", "text": "Alice flies on June 3rd", "tags": ["travel"]},
           {"kind": "edge", "source": "Alice", "target": "Lyon", "rel_type": "Lives In", "tags": ["home"]}]


def test_the_unified_shape_as_a_list_or_items():
    bare = parse_write_blocks(f"<shadow_write>{json.dumps(UNIFIED)}</shadow_write>")[0].block
    wrapped = parse_write_blocks(f"<memory_write>{json.dumps({'items': UNIFIED})}</memory_write>")[0].block
    assert bare == wrapped
    assert bare.all_entities() == [Entity(name="Lyon", type=EntityType.PLACE, description="a city in France")]
    assert bare.all_edges() == [Edge(source="Alice", target="Lyon", rel_type="lives_in")]
    [(kind, position, observation)] = bare.all_observations()
    assert (kind, position, observation.name, observation.tags) == ("item", 1, "Alice", ["travel"])


def test_what_the_graph_gets_typed_and_named_once():
    block = parse_write_blocks('<memory_write>{"entities": [{"name": "lyon", "description": "home"}], '
                               '"edges": [{"source": "Alice", "target": "Lyon", "rel_type": "lives_in"}, '
                               '{"source": "Alice", "target": "Acme", "rel_type": "works-at"}, '
                               '{"source": "Alice", "target": "Rex", "rel_type": "has_pet"}], '
                               '"observations": [{"text": "x"}, {"text": "Rex is old", "name": "Rex"}]}'
                               '</memory_write>')[0].block
    plan: GraphPlan = graph_plan([block], "user:a:alice", "m1")
    assert [(e.name, e.type, e.summary) for e in plan.entities] == [
        ("lyon", EntityType.PLACE, "home"),  # untyped by its entity: what the edge says of its object
        ("Alice", EntityType.PERSON, ""), ("Acme", EntityType.ORGANISATION, ""), ("Rex", EntityType.OBJECT, "")]
    assert [(f.subject, f.predicate, f.object, f.text, f.message_ids) for f in plan.facts][1] == \
        ("Alice", "works_at", "Acme", "Alice works at Acme", ["m1"])
    assert plan.about == {1: "Rex"}
    assert all(w in TYPE_WORDS for w in ("city", "company", "pet", "person"))


@pytest.mark.parametrize("text,where", [
    ('<memory_write>[{"kind": "entity", "name": "A"}, {"kind": "entity"}]</memory_write>', "items[1].name: Field required"),
    ('<memory_write>[{"kind": "person", "name": "A"}]</memory_write>', "items[0]: Input tag 'person'"),
    ('<memory_write>[{"name": "A"}]</memory_write>', "items[0]: Unable to extract tag"),
    ('<memory_write>{"entities": [{"name": "A", "type": "spaceship"}]}</memory_write>',
     "entities[0].type: Value error, unknown entity type 'spaceship'"),
    ('<memory_write>{"edges": [{"source": "A", "target": "B", "rel_type": "2 lives"}]}</memory_write>',
     "edges[0].rel_type: Value error, a relation is"),
    ('<memory_write>{"edges": [{"source": "Ann", "target": " ann ", "rel_type": "knows"}]}</memory_write>',
     "edges[0]: Value error, source and target name the same entity"),
    ('<memory_write>{"entities": ["!!"]}</memory_write>', "entities[0].name: Value error, a name needs a letter"),
    ('<memory_write>[{"kind": "observation", "text": "t", "name": "?"}]</memory_write>', "items[0].name"),
    ('<memory_write>{"entities": [{"name": "A", "description": "' + "d" * 1001 + '"}]}</memory_write>',
     "entities[0].description"),
    ('<memory_write>[]</memory_write>', "writes nothing"),
])
def test_a_malformed_graph_item_says_which_field(text, where):
    with pytest.raises(WriteBlockError) as caught:
        parse_write_blocks(text)
    assert where in str(caught.value), str(caught.value)
