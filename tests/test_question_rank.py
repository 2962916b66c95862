"""Question-aware ranking (memory_service/recall/question_rank.py) and the question's cues
(memory_service/domain/question.py): the cues read from plain questions, then each factor
on the real service (embedded FalkorDB, the hash embedder), compared with the same search
with the factor off, on the same store."""

from __future__ import annotations

from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta

from memory_service.domain.question import cues, feedback_terms, period
from memory_service.runtime import open_service

from .helpers import T0, msg, wait_embedded

ASKED = datetime(2023, 5, 30, 12, tzinfo=UTC)


def test_cues_people_assistant_and_aggregation():
    asked = cues("What did Caroline say about the adoption agency?", ASKED)
    assert "caroline" in asked.words and not asked.assistant and not asked.aggregate
    assert cues("What did you suggest for dinner?", ASKED).assistant
    assert cues("Can you remind me of the hotel you recommended?", ASKED).assistant
    assert cues("What was your recommendation for the trip?", ASKED).assistant
    assert not cues("What did I tell my sister about you?", ASKED).assistant
    assert cues("How many books did I buy in total?", ASKED).aggregate
    assert cues("Which of my cousins came to both weddings?", ASKED).aggregate
    assert not cues("Where does Tom work?", ASKED).aggregate
    assert cues("Which did I do first, the hike or the swim?", ASKED).first
    assert not cues("What did I do last?", ASKED).first


def test_periods_are_read_relative_to_when_the_question_is_asked():
    def holds(text: str, *days: datetime) -> list[bool]:
        found = period(text, ASKED)
        assert found is not None, text
        return [found[0] <= d < found[1] for d in days]

    last_week = datetime(2023, 5, 25, tzinfo=UTC)
    assert holds("What did I buy last week?", last_week, datetime(2023, 4, 1, tzinfo=UTC)) == [True, False]
    assert holds("What did I cook two weeks ago?", datetime(2023, 5, 16, tzinfo=UTC), last_week) == [True, False]
    assert holds("Where was I in May 2022?", datetime(2022, 5, 10, tzinfo=UTC), datetime(2023, 5, 10, tzinfo=UTC)) \
        == [True, False]
    # A month without a year is the latest one: March of the question's year, December of the year before.
    assert holds("What did I do in March?", datetime(2023, 3, 15, tzinfo=UTC)) == [True]
    assert holds("What did I do in December?", datetime(2022, 12, 15, tzinfo=UTC)) == [True]
    assert holds("What happened on March 3rd?", datetime(2023, 3, 3, 18, tzinfo=UTC),
                 datetime(2023, 3, 10, tzinfo=UTC)) == [True, False]
    assert holds("What did I eat yesterday?", datetime(2023, 5, 29, 20, tzinfo=UTC)) == [True]
    assert holds("What did I read in 2021?", datetime(2021, 7, 1, tzinfo=UTC), datetime(2022, 1, 2, tzinfo=UTC)) \
        == [True, False]
    for none in ("May I ask what my dog's name is?", "What is my favourite colour?", "How many days did it take?"):
        assert period(none, ASKED) is None, none


def test_feedback_terms_are_what_the_best_results_share_beyond_the_query():
    texts = ["alice: the ferry to Porto leaves at nine", "alice: Porto ferry tickets are booked",
             "bob: the bees are fine"]
    assert feedback_terms(texts, ["trip", "portugal"], 5) == ["alice", "ferry", "porto"]
    assert feedback_terms(texts, ["ferries", "porto", "alice"], 5) == []  # stems of the query's words count as the query's
    assert feedback_terms(["only one text here"], ["query"], 2) == ["one", "text"]


@asynccontextmanager
async def ranked_by(settings, **weights):
    """The service on the same store with these question-aware weights (no worker: reads only)."""
    async with open_service(settings.model_copy(update=weights), run_worker=False) as service:
        yield service


def order(result) -> list[str]:
    return [mid for h in result.results for mid in h.source_message_ids]


async def test_a_question_naming_a_speaker_ranks_that_speakers_turn_first(service, settings):
    await service.record_message("s1", msg("a1", "melanie", "Caroline, adoption agencies are slow; adoption agencies "
                                                            "need so much patience, adoption is hard.", mid="m1"))
    await service.record_message("s1", msg("a1", "caroline", "I looked at adoption agencies for my future family.",
                                           mid="c1", minute=1))
    await wait_embedded(service, "a1")
    question = "What did Caroline learn about adoption agencies?"
    assert order(await service.search("a1", question, top_k=2)) == ["m1", "c1"]  # the words alone: Melanie's
    async with ranked_by(settings, search_question_people=3.0) as people:
        result = await people.search("a1", question, top_k=2)
    assert order(result) == ["c1", "m1"]
    assert result.results[0].score > result.results[1].score


async def test_what_did_you_tell_me_ranks_the_assistants_turn_first(service, settings):
    await service.record_message("s1", msg("a1", "alice", "The Hotel Avenida is my pick for you.",
                                           role="assistant", mid="r1"))
    await service.record_message("s1", msg("a1", "alice", "Please recommend a hotel in Lisbon, recommend a hotel near "
                                                          "the river, a Lisbon hotel.", mid="u1", minute=1))
    await wait_embedded(service, "a1")
    question = "Which hotel in Lisbon did you recommend?"
    assert order(await service.search("a1", question, top_k=2))[0] == "u1"
    async with ranked_by(settings, search_question_people=3.0) as people:
        assert order(await people.search("a1", question, top_k=2)) == ["r1", "u1"]


async def test_a_how_many_in_total_question_spreads_across_sessions(service, settings):
    # One session says a lot about books; two others say one thing each.
    for i, text in enumerate(["I bought three books at the fair, books everywhere.",
                              "More books: I bought two books of poems.", "The books I bought are heavy books."]):
        await service.record_message("fair", msg("a1", "alice", text, mid=f"fair-{i}", minute=i))
    await service.record_message("shop", msg("a1", "alice", "I bought a cookbook, one book.", mid="shop-0", minute=10))
    await service.record_message("gift", msg("a1", "alice", "Tom gave me a book I had not bought.", mid="gift-0",
                                             minute=20))
    await wait_embedded(service, "a1")
    question = "How many books did I buy in total?"

    def sessions(result) -> list[str]:
        return [h.session_id for h in result.results]

    before = await service.search("a1", question, top_k=3)
    assert sessions(before) == ["fair"] * 3
    async with ranked_by(settings, search_question_aggregate=2.0) as spread:
        after = await spread.search("a1", question, top_k=3)
        assert sorted(sessions(after)) == ["fair", "gift", "shop"]
        # A question that gathers nothing keeps the words' order.
        assert sessions(await spread.search("a1", "Which books did I buy at the fair?", top_k=3))[:2] == ["fair"] * 2
    async with ranked_by(settings, search_question_aggregate=2.0, search_question_aggregate_always=True) as always:
        assert len(set(sessions(await always.search("a1", "Which books did I buy at the fair?", top_k=3)))) == 3


async def test_a_question_naming_a_period_ranks_that_periods_turns_first(service, settings):
    asked = T0 + timedelta(days=60)
    await service.record_message("s1", msg("a1", "alice", "I cooked a big pasta dinner: pasta, pasta sauce, pasta "
                                                          "salad, cooked all day.", mid="old", minute=0))
    await service.record_message("s2", msg("a1", "alice", "I made pasta for Tom.", mid="recent",
                                           minute=(60 - 7) * 24 * 60))
    await wait_embedded(service, "a1")
    question = "What pasta did I cook last week?"
    assert order(await service.search("a1", question, top_k=2, as_of=asked)) == ["old", "recent"]
    async with ranked_by(settings, search_question_time=3.0) as timed:
        assert order(await timed.search("a1", question, top_k=2, as_of=asked)) == ["recent", "old"]
        # Asked two months later, "last week" is neither: the words' order stands.
        later = await timed.search("a1", question, top_k=2, as_of=asked + timedelta(days=60))
        assert order(later) == ["old", "recent"]


async def test_feedback_finds_what_the_question_calls_by_another_name(service, settings):
    lines = [("t0", "Our Portugal trip: the ferry to Porto leaves at nine."),
             ("t1", "For the Portugal trip I booked the Porto ferry."),
             ("f0", "The ferry tickets to Porto are printed."),
             *((f"n{i}", f"Note {i}: the garden needs water and the bees need sugar.") for i in range(6))]
    for minute, (mid, text) in enumerate(lines):
        await service.record_message("s1", msg("a1", "alice", text, mid=mid, minute=minute))
    await wait_embedded(service, "a1")
    question = "What is planned for the Portugal trip?"
    before = await service.search("a1", question, top_k=9)
    async with ranked_by(settings, search_feedback_weight=1.0, search_feedback_docs=2) as fed:
        after = await fed.search("a1", question, top_k=9)
    print(before.signals, order(before), after.signals, order(after))
    assert order(after).index("f0") < order(before).index("f0")
    assert order(after).index("f0") == 2 and "feedback" in after.signals
