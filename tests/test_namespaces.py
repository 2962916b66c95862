import inspect
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memory_service.domain.errors import InvalidInput
from memory_service.domain.namespaces import ID_ARGUMENTS, MAX_ID_LENGTH, Namespace, NamespaceKind, validate_id

# Any Unicode the id rules accept: no ':', '/' or '\\', no control/surrogate/unassigned, no
# outer spaces, not '.' or '..'.
ids = st.text(
    alphabet=st.characters(blacklist_categories=("Cc", "Cs", "Cn", "Cf"), blacklist_characters=":/\\\ufffd"),
    min_size=1,
    max_size=40,
).filter(lambda s: s == s.strip() and s not in (".", ".."))

namespaces = st.one_of(
    ids.map(Namespace.session),
    st.tuples(ids, ids).map(lambda t: Namespace.user(*t)),
    st.tuples(ids, ids).map(lambda t: Namespace.shard(*t)),
    ids.map(Namespace.agent),
)

GROUP_ID = re.compile(r"[A-Za-z0-9_]+")


@given(namespaces)
@settings(max_examples=500)
def test_group_id_round_trips_and_uses_only_safe_characters(ns):
    gid = ns.group_id
    assert GROUP_ID.fullmatch(gid), gid
    assert gid not in ("", "_")
    assert "-" not in gid
    assert Namespace.from_group_id(gid) == ns
    assert Namespace.parse(str(ns)) == ns


@given(namespaces, namespaces)
@settings(max_examples=500)
def test_group_id_is_injective(a, b):
    assert (a.group_id == b.group_id) == (a == b)


@given(ids, ids)
def test_fields_that_differ_only_by_separator_placement_never_meet(x, y):
    assert Namespace.user(x + "_", y).group_id != Namespace.user(x, "_" + y).group_id


def test_the_design_collision_example_stays_apart():
    assert Namespace.parse("session:a_b").group_id != Namespace.parse("user:a:b").group_id
    assert Namespace.parse("session:a_b").group_id == "session__a_5f_b"
    with pytest.raises(InvalidInput, match="unknown kind 'session_a'"):
        Namespace.parse("session_a:b")


@pytest.mark.parametrize(
    "text, message",
    [
        ("session", "has no ':'"),
        ("bogus:x", "unknown kind"),
        ("session:", "must not be empty"),
        ("user:a", "has 2 field"),
        ("user:a:b:c", "has 2 field"),
        ("agent: a", "white space"),
        ("session:a\x00b", "control"),
        ("session:" + "x" * (MAX_ID_LENGTH + 1), "limit"),
        ("session:a/b", "must not contain '/'"),
        ("session:a\\b", r"must not contain '\\'"),
        ("session:.", "must not be '.'"),
        ("session:..", "must not be '..'"),
        ("session:\ud800", "surrogate"),
    ],
)
def test_bad_namespaces_get_a_clear_error(text, message):
    with pytest.raises(InvalidInput, match=message):
        Namespace.parse(text)


@pytest.mark.parametrize("gid", ["", "_", "session", "nope__x", "session__a_5f", "session__a_zz_b", "session__a-b", "session__a_00_"])
def test_foreign_group_ids_are_rejected(gid):
    with pytest.raises(InvalidInput):
        Namespace.from_group_id(gid)


def test_validate_id_rejects_non_strings():
    with pytest.raises(InvalidInput, match="must be a string"):
        validate_id(42, "agent_id")


def test_every_kind_has_a_constructor():
    assert {Namespace.session("s").kind, Namespace.user("a", "u").kind, Namespace.shard("a", "s").kind,
            Namespace.agent("a").kind} == set(NamespaceKind)


def _id_taking_methods():
    """(method name, id argument) of every public coroutine method of the facade."""
    from memory_service.service import MemoryService

    for name, method in vars(MemoryService).items():
        if not name.startswith("_") and inspect.iscoroutinefunction(method):
            for argument in inspect.signature(method).parameters:
                if argument in ID_ARGUMENTS:
                    yield name, argument


def test_the_facade_takes_ids_of_many_kinds():
    """The check below covers every kind of id the facade is given (it cannot pass on none)."""
    assert {argument for _, argument in _id_taking_methods()} == set(ID_ARGUMENTS)


@pytest.mark.parametrize("bad", ["a/b", "a:b", " a", "", ".."])
async def test_the_facade_checks_every_id_before_it_does_anything(bad):
    """MemoryService is where ids enter in process (docs/getting-started.md, "From Python, in process"): each
    method refuses a malformed id argument before it runs (here on no service at all: any
    step taken would fail otherwise), so the parts below it need not check again."""
    from memory_service.service import MemoryService

    for name, argument in _id_taking_methods():
        method = getattr(MemoryService, name)
        arguments = {p.name: None for p in inspect.signature(method).parameters.values()
                     if p.name != "self" and p.kind is not inspect.Parameter.VAR_KEYWORD}
        with pytest.raises(InvalidInput, match=f"^{argument} "):
            await method(None, **{**arguments, argument: bad})
