"""The offline rule-based extractor: episode, directives, facts and suggestions from one window."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memory_service.domain.models import WORD_LIMITS, MemoryKind, Role, Shard
from memory_service.formation.extractor import Extraction, Window, WindowMessage
from memory_service.formation.rule_extractor import RuleBasedExtractor, content_words, limit_words, split_sentences

T0 = datetime(2026, 5, 1, 9, 0, tzinfo=UTC)
AGENT = "planner"

TRAVEL = Shard(agent_id=AGENT, shard_id="travel", name="travel logistics",
               extraction_focus="flights, trains, hotels, bookings, dates, budget")
FOOD = Shard(agent_id=AGENT, shard_id="food", name="food and restaurants",
             extraction_focus="restaurants, dinner, lunch, cuisine, allergies")
RELEASE = Shard(agent_id=AGENT, shard_id="release", name="release planning",
                extraction_focus="deadlines, shipping, QA, launch")


def window(*lines: tuple[str, str, str], shards: tuple[Shard, ...] = ()) -> Window:
    """A window of (user_id, role, content) lines with ids m0, m1, …"""
    messages = tuple(
        WindowMessage(message_id=f"m{i}", sequence=i, role=Role(role), user_id=user, content=content,
                      created_at=T0 + timedelta(minutes=i))
        for i, (user, role, content) in enumerate(lines)
    )
    return Window(agent_id=AGENT, session_id="s1", messages=messages, shards=shards)


async def extract(w: Window) -> Extraction:
    return await RuleBasedExtractor().extract(w)


def of_kind(extraction: Extraction, kind: MemoryKind, shard_id: str | None = None):
    return [i for i in extraction.items if i.kind is kind and (shard_id is None or i.shard_id == shard_id)]


def words(text: str) -> int:
    return len(text.split())


def check_invariants(w: Window, result: Extraction) -> None:
    """What every extraction must satisfy, whatever the window says."""
    ids = {m.message_id for m in w.messages}
    active = {s.shard_id for s in w.shards if s.active}
    if result.episode is not None:
        assert 0 < words(result.episode) <= WORD_LIMITS[MemoryKind.EPISODE]
    for item in result.items:
        assert item.content.strip()
        assert words(item.content) <= WORD_LIMITS[item.kind], item
        assert item.message_ids and set(item.message_ids) <= ids, item
        if item.kind is MemoryKind.DIRECTIVE:
            assert item.user_id and item.shard_id is None
            speakers = {m.user_id for m in w.messages if m.message_id in item.message_ids}
            roles = {m.role for m in w.messages if m.message_id in item.message_ids}
            assert speakers == {item.user_id} and roles == {Role.USER}
        elif item.shard_id is None:  # a personal fact: kept for the user it is about
            assert item.kind is MemoryKind.FACT and item.user_id, item
            assert item.user_id in {m.user_id for m in w.messages if m.role == Role.USER}, item
        else:
            assert item.kind in (MemoryKind.FACT, MemoryKind.SUGGESTION)
            assert item.shard_id in active


# --- limit_words ---------------------------------------------------------------------


def test_limit_words_keeps_short_text_and_collapses_white_space():
    assert limit_words("  the   deadline\n is\tMay 1st ", 30) == "the deadline is May 1st"
    assert limit_words("one two three", 3) == "one two three"


def test_limit_words_cuts_and_marks_the_cut_without_adding_a_word():
    cut = limit_words("one two three, four five", 3)
    assert cut == "one two three…"
    assert words(cut) == 3
    assert limit_words("anything", 0) == ""


def test_sentence_splitting_and_content_words():
    assert split_sentences("Hi! The hotel is booked.  What now?\nok   then") == [
        "Hi!", "The hotel is booked.", "What now?", "ok then"]
    assert split_sentences("   \n\t  ...  !!") == []
    # plurals and verb endings meet their base word; stop words are dropped
    assert content_words("We booked the hotels") == content_words("booking a hotel")
    assert content_words("allergies") == content_words("allergic")
    assert content_words("I think we should, yes") == []


# --- episode -------------------------------------------------------------------------

PLANNING = (
    ("alice", "user", "Hi! I'm planning a trip to Lisbon with my friend Bob in early June."),
    ("alice", "assistant", "Lovely. What kind of trip do you have in mind?"),
    ("alice", "user", "The flight from Berlin leaves on June 3rd at 9am and we land in Lisbon at 11:40."),
    ("alice", "assistant", "Great. I found the hotel Casa do Rio in Lisbon, near the river, for June 3rd to 7th."),
    ("alice", "user", "Ok."),
    ("alice", "user", "I'm vegetarian, so dinner places in Lisbon need good vegetarian dishes."),
)


async def test_episode_is_short_prefixed_by_speakers_and_in_window_order():
    result = await extract(window(*PLANNING))
    episode = result.episode
    assert episode is not None
    assert words(episode) <= 50
    assert episode.startswith("alice: ")
    # contentless turns are left out
    assert "Ok." not in episode and "Lovely." not in episode
    # the chosen sentences keep their order in the window
    positions = [episode.find(s) for s in ("planning a trip", "flight from Berlin", "vegetarian")
                 if s in episode]
    assert len(positions) >= 2 and positions == sorted(positions)


async def test_episode_names_each_speaker_once_per_turn():
    result = await extract(window(
        ("alice", "user", "The Lisbon hotel is booked."),
        ("alice", "assistant", "The Lisbon hotel has a river view."),
        ("bob", "user", "Lisbon trams run until midnight. The hotel is near a tram stop."),
    ))
    assert result.episode == ("alice: The Lisbon hotel is booked. assistant: The Lisbon hotel has a river view. "
                              "bob: Lisbon trams run until midnight. The hotel is near a tram stop.")


async def test_episode_is_deterministic():
    w = window(*PLANNING)
    first = await RuleBasedExtractor().extract(w)
    second = await RuleBasedExtractor().extract(w)
    assert first.episode == second.episode
    assert first.items == second.items


async def test_episode_prefers_the_informative_sentence():
    result = await extract(window(
        ("alice", "user", "Thanks, ok."),
        ("alice", "user", "The Lisbon budget is 2000 euros and the Lisbon hotel costs 140 euros per night."),
        ("alice", "assistant", "Sure, sounds good!"),
        ("alice", "user", "Lisbon hotel prices rise in June, so the budget matters."),
    ))
    assert result.episode is not None
    assert "alice: The Lisbon budget is 2000 euros" in result.episode
    assert "Thanks" not in result.episode and "Sure" not in result.episode


async def test_episode_skips_what_it_already_said():
    # Only two of the three sentences fit; the second near-copy adds nothing new.
    booking = "The Lisbon hotel booking near the river costs {} euros per night with breakfast, free cancellation and late checkout included for everyone."
    trams = "Trams to Sintra leave from Rossio station every twenty minutes, tickets are sold at machines, and the palaces open at nine."
    result = await extract(window(
        ("alice", "user", booking.format(140)),
        ("bob", "user", booking.format(150)),
        ("carol", "user", trams),
    ))
    assert result.episode == f"alice: {booking.format(140)} carol: {trams}"


async def test_episode_prefers_users_over_the_assistant():
    # Equally informative sentences (same length, same number of distinct content words),
    # room for one: the user's wins although the tie-break favours the earlier sentence.
    porto = ("Porto offers trams, cellars, churches, cruises, bakeries, bookshops, viewpoints, tiles, bridges, "
             "markets, gardens, fountains, beaches, stairs, museums, cafes, towers, galleries, squares, parks, "
             "ferries, vineyards, harbours, festivals, lanes.")
    madrid = ("Madrid offers avenues, palaces, stadiums, rooftops, theatres, plazas, libraries, kiosks, terraces, "
              "arcades, cinemas, taverns, bullrings, observatories, boulevards, monasteries, workshops, pavilions, "
              "orchards, studios, ponds, zoos, chapels, courtyards, fairs.")
    result = await extract(window(("alice", "assistant", porto), ("alice", "user", madrid)))
    assert result.episode == f"alice: {madrid}"


async def test_episode_leaves_out_chat_formulas_even_with_words_to_spare():
    result = await extract(window(
        ("bob", "user", "Thanks so much, that's really helpful!"),
        ("bob", "assistant", "You're welcome! Happy to help anytime."),
        ("bob", "user", "Can you book the 10:41 train from Rossio to Sintra on June 4th?"),
        ("bob", "assistant", "Booked: 2 tickets, 2.40 euros each, platform 3."),
        ("bob", "user", "Great, thank you so much! Always a pleasure."),
        ("bob", "assistant", "Always a pleasure to help, Bob! Take care!"),
    ))
    assert result.episode == ("bob: Can you book the 10:41 train from Rossio to Sintra on June 4th? "
                              "assistant: Booked: 2 tickets, 2.40 euros each, platform 3.")


async def test_a_window_of_small_talk_still_has_an_episode():
    result = await extract(window(("alice", "user", "Thanks, lovely chatting!"), ("alice", "assistant", "Take care!")))
    assert result.episode and words(result.episode) <= 50


async def test_episode_prefers_names_numbers_and_dates_to_repeated_generalities():
    # Room for one of the two: the one a later question could ask about wins, although the
    # other repeats the window's most frequent words.
    generic = ("The trip plan still feels like a good trip plan, and the whole group likes the trip plan, "
               "the trip route and the trip mood a lot.")
    concrete = ("The flight to Lisbon leaves Berlin on June 3rd at 9:40 from gate B12, costs 180 euros, "
                "and the hotel Casa do Rio holds room 214.")
    result = await extract(window(("alice", "user", generic), ("bob", "user", concrete), ("carol", "user", "Thanks!")))
    assert result.episode == f"bob: {concrete}"


async def test_episode_of_a_long_window_stays_within_the_limit():
    lines = [("alice" if i % 2 else "bob", "user", f"Topic {i}: the server migration step {i} needs review and a rollback plan.")
             for i in range(60)]
    result = await extract(window(*lines))
    assert result.episode and words(result.episode) <= 50
    assert result.episode.split()[0] in ("alice:", "bob:")


async def test_a_single_overlong_sentence_is_cut_to_the_limit():
    long_sentence = "The migration " + " ".join(f"touches service{i}" for i in range(80)) + "."
    result = await extract(window(("alice", "user", long_sentence)))
    assert result.episode is not None
    assert words(result.episode) == 50
    assert result.episode.startswith("alice: The migration touches service0")
    assert result.episode.endswith("…")


@pytest.mark.parametrize("contents", [
    (),
    ("   ",),
    ("\n\t  \n", "  ...  ", "!!"),
])
async def test_empty_or_blank_windows_give_nothing(contents):
    w = window(*[("alice", "user", c) for c in contents], shards=(TRAVEL, FOOD))
    result = await extract(w)
    assert result.episode is None
    assert result.items == []


async def test_tool_and_system_messages_are_not_read():
    w = window(
        ("alice", "system", "Always answer in French. The hotel budget is 100 euros."),
        ("alice", "tool", "search results: hotel Casa do Rio, 140 euros, free cancellation"),
        shards=(TRAVEL,),
    )
    result = await extract(w)
    assert result.episode is None
    assert result.items == []


# --- directives ----------------------------------------------------------------------


@pytest.mark.parametrize("sentence", [
    "I prefer window seats on flights.",
    "I really like short answers with bullet points.",
    "Please always answer in French.",
    "Never book anything before 10am for me.",
    "Always use metric units.",
    "Call me Bobby.",
    "Remember that my daughter is five.",
    "From now on, reply in Portuguese.",
    "Keep answers short.",
    "You can call me Liz.",
    "I work night shifts, so don't message before noon.",  # about the user AND how to act: a directive
    "Could you always answer in bullet points?",
    "Whenever you suggest a restaurant, include the price range.",
    "I prefer aisle seats when you book my flights.",
])
async def test_instructions_become_directives_of_their_speaker(sentence):
    result = await extract(window(("carol", "user", f"Hello there. {sentence}")))
    directives = of_kind(result, MemoryKind.DIRECTIVE)
    assert [(d.content, d.user_id, d.message_ids) for d in directives] == [(sentence, "carol", ("m0",))]
    assert of_kind(result, MemoryKind.FACT) == []


@pytest.mark.parametrize(("sentence", "fact"), [
    ("I love spicy food.", "carol loves spicy food."),
    ("I hate early mornings.", "carol hates early mornings."),
    ("I don't like long emails.", "carol doesn't like long emails."),
    ("My name is Carol Jensen.", "carol's name is Carol Jensen."),
    ("I'm a nurse on night shifts.", "carol is a nurse on night shifts."),
    ("I am an early riser.", "carol is an early riser."),
    ("I work at Siemens as an engineer.", "carol works at Siemens as an engineer."),
    ("I live in Porto.", "carol lives in Porto."),
    ("I'm allergic to peanuts.", "carol is allergic to peanuts."),
    ("I'm vegetarian, just so you know.", "carol is vegetarian."),  # the aside to the listener goes
    ("Yeah, I play the clarinet!", "carol plays the clarinet."),
    ("I love camping trips with my family.", "carol loves camping trips with their family."),
    ("I have two kids.", "carol has two kids."),
    ("My wife is allergic to nuts.", "carol's wife is allergic to nuts."),
    ("I just started learning the violin.", "carol just started learning the violin."),
])
async def test_a_first_person_statement_becomes_a_third_person_fact_about_the_user(sentence, fact):
    result = await extract(window(("carol", "user", sentence)))
    facts = of_kind(result, MemoryKind.FACT)
    assert [(f.content, f.user_id, f.shard_id, f.message_ids) for f in facts] == [(fact, "carol", None, ("m0",))]
    assert of_kind(result, MemoryKind.DIRECTIVE) == []


@pytest.mark.parametrize("sentence", [
    "Hi there! How are you today?",
    "Sounds good. Ok thanks, bye!",
    "Yeah, I love to.",
    "Me too!",
    "Thank you so much, that means a lot!",
    "Congrats on the new job!",
    "Have a lovely trip!",
])
async def test_pleasantries_and_answers_cut_short_yield_nothing(sentence):
    result = await extract(window(("carol", "user", sentence), ("alice", "assistant", sentence), shards=(TRAVEL, FOOD)))
    assert result.items == []


@pytest.mark.parametrize("sentence", [
    "They were an important part of my wedding decor and always remind me of that day.",
    "That hotel fits the budget well.",
    "It closes at 6pm on weekdays.",
    "Those flights were the cheapest option.",
    "She loves the train to Porto.",
])
async def test_a_sentence_that_refers_back_to_another_turn_is_not_stored(sentence):
    result = await extract(window(("carol", "user", sentence), ("alice", "assistant", sentence), shards=(TRAVEL,)))
    assert result.items == []


@pytest.mark.parametrize("sentence", ["Do you like hotels near the station?", "What's my name again?",
                                      "Could you book the hotel?"])
async def test_a_question_yields_nothing(sentence):
    assert (await extract(window(("carol", "user", sentence), shards=(TRAVEL,)))).items == []


async def test_the_assistants_words_about_the_user_are_a_fact_about_that_user():
    w = window(("vic", "user", "When do I land?"), ("alice", "assistant", "Your flight TP1342 lands in Lisbon at 10:05."),
               shards=(TRAVEL,))
    (fact,) = (await extract(w)).items
    assert (fact.kind, fact.user_id, fact.shard_id, fact.content) == (
        MemoryKind.FACT, "vic", None, "vic's flight TP1342 lands in Lisbon at 10:05.")


async def test_directive_inside_a_longer_sentence_keeps_the_whole_sentence():
    sentence = "I prefer window seats on flights, and please always keep the total budget under 2000 euros."
    result = await extract(window(("alice", "user", sentence)))
    assert [d.content for d in of_kind(result, MemoryKind.DIRECTIVE)] == [sentence]


@pytest.mark.parametrize("sentence", [
    "Do you know whether I prefer aisle seats?",
    "Should I always book early?",
    "What's my name again?",
    "I've never been to Lisbon.",
    "The museum is never open on Mondays.",
    "Call me tomorrow about the tickets.",
    "I like it.",
    "I love that idea!",
    "I love hiking.",  # about the user: a fact, not a directive
    "Never mind.",
    "I'm a bit tired today.",
    "The hotel is booked.",
    # pleasantries, reactions and encouragement that look like rules or preferences
    "Always good chatting with you.",
    "Thanks, I love it!",
    "I love that photo!",
    "I'd love to see it!",
    "Never give up on your dreams!",
    # questions, one-off tasks, past events, hypotheticals, other people's words
    "Do you prefer tea?",
    "Book the 9am train for me.",
    "I'd prefer to leave at 8 tomorrow.",
    "I went hiking last weekend.",
    "If I were rich I'd always fly business class.",
    "My mom always said, never trust a skinny chef.",
    "My sister loves horses.",
])
async def test_no_directive_from_questions_or_look_alikes(sentence):
    result = await extract(window(("carol", "user", sentence)))
    assert of_kind(result, MemoryKind.DIRECTIVE) == []


@pytest.mark.parametrize("sentence", [
    # a request for this turn's task, however it asks the reply to look
    "Please answer point by point.",
    "Reply in Spanish, so my mother can read this one.",
    "Write 4 bullet points to pitch the app to a seed investor.",
    "Provide a step-by-step explanation of how to install the printer driver.",
    "Explain compound interest in simple terms.",
    "Can you recommend thrillers with a bleak, wintry tone?",
    "Make me a quiz on the Tudors, with the answers at the end.",
    "Stop and wait for my next message before you answer.",
    # a conditional preference: the choice at hand
    "I'd prefer something around six weeks long.",
    "I'd rather stay near the station.",
    # the user's own resolution, a clause that only ends with the marker
    "I'll walk to work from now on.",
    "I need a phone plan to call home and send messages from now on.",
    # a like of an option shown, not of a kind of reply
    "I like number 2 - write the summary at the end.",
])
async def test_a_request_for_this_turns_task_is_no_directive(sentence):
    result = await extract(window(("carol", "user", sentence)))
    assert of_kind(result, MemoryKind.DIRECTIVE) == []


@pytest.mark.parametrize("sentence", [
    "In future, always give prices in euros.",
    "Talk to me like a friend, not a robot.",
    "For future reference, quote prices with tax included.",
])
async def test_marks_of_persistence_make_a_directive(sentence):
    result = await extract(window(("carol", "user", sentence)))
    assert [d.content for d in of_kind(result, MemoryKind.DIRECTIVE)] == [sentence]


async def test_a_pasted_text_and_the_assistants_advice_are_not_the_users_directives():
    result = await extract(window(
        ("dan", "user", "Can you make our house rules friendlier?\nAlways use the side door after 10pm.\n"
                        "Always keep the hallway clear.\nNever put glass in the green bin."),
        ("dan", "assistant", "Always feed the starter before you leave, and never seal the jar. "
                             "You should always keep a dried backup."),
        ("dan", "user", "Thanks, that helps."),
    ))
    assert of_kind(result, MemoryKind.DIRECTIVE) == []


async def test_no_directives_from_the_assistant():
    result = await extract(window(
        ("alice", "assistant", "I prefer concise answers. Always check the dates. My name is Atlas."),
    ))
    assert of_kind(result, MemoryKind.DIRECTIVE) == []


async def test_directives_and_facts_are_attributed_to_each_speaker_and_deduplicated():
    result = await extract(window(
        ("alice", "user", "I'm vegetarian."),
        ("bob", "user", "Call me Bobby. I hate early mornings."),
        ("alice", "assistant", "Noted."),
        ("alice", "user", "I'm  vegetarian!"),  # the same fact again, differently spelled
        ("bob", "user", "I'm vegetarian."),  # the same words from someone else: their own fact
    ))
    got = [(d.kind, d.user_id, d.content, d.message_ids) for d in result.items]
    assert got == [
        (MemoryKind.FACT, "alice", "alice is vegetarian.", ("m0", "m3")),
        (MemoryKind.DIRECTIVE, "bob", "Call me Bobby.", ("m1",)),
        (MemoryKind.FACT, "bob", "bob hates early mornings.", ("m1",)),
        (MemoryKind.FACT, "bob", "bob is vegetarian.", ("m4",)),
    ]


async def test_long_directive_is_cut_to_25_words():
    sentence = "Please always answer with " + " ".join(f"word{i}" for i in range(40)) + "."
    result = await extract(window(("alice", "user", sentence)))
    (directive,) = of_kind(result, MemoryKind.DIRECTIVE)
    assert words(directive.content) == 25
    assert directive.content.startswith("Please always answer with word0 word1")
    assert directive.content.endswith("word20…")


async def test_a_fact_about_the_user_is_not_also_a_shard_fact():
    # a user's personal context stays in the user's namespace, not the shared shard
    result = await extract(window(("alice", "user", "I'm allergic to peanuts at dinner."), shards=(FOOD,)))
    assert [(f.content, f.shard_id) for f in result.items] == [("alice is allergic to peanuts at dinner.", None)]


# --- facts ---------------------------------------------------------------------------


async def test_facts_go_to_matching_active_shards_and_name_their_source():
    inactive_food = FOOD.model_copy(update={"active": False})
    w = window(
        ("alice", "user", "The deadline is May 1st. QA signs off on Friday."),
        ("bob", "user", "The dinner place is booked for eight."),
        ("bob", "user", "My cat is called Miso."),
        ("alice", "assistant", "The launch checklist has twelve steps."),
        shards=(RELEASE, inactive_food, TRAVEL),
    )
    result = await extract(w)
    facts = [(f.shard_id, f.content, f.message_ids, f.user_id) for f in of_kind(result, MemoryKind.FACT)]
    assert facts == [
        ("release", "The deadline is May 1st.", ("m0",), "alice"),
        ("release", "QA signs off on Friday.", ("m0",), "alice"),
        # "booked" meets the travel focus "bookings"; the food shard is inactive
        ("travel", "The dinner place is booked for eight.", ("m1",), "bob"),
        ("release", "The launch checklist has twelve steps.", ("m3",), None),
    ]
    check_invariants(w, result)


async def test_no_facts_from_questions_small_talk_or_unrelated_shards():
    w = window(
        ("alice", "user", "When is the deadline?"),
        ("alice", "assistant", "Noted, the deadline matters. I will track the deadline."),
        ("alice", "user", "The weather in Porto is lovely."),
        shards=(RELEASE, FOOD),
    )
    result = await extract(w)
    assert result.items == []


async def test_a_sentence_on_two_topics_is_a_fact_once_in_the_shard_it_is_most_about():
    w = window(
        ("alice", "user", "The restaurant is close to the hotel."),
        ("alice", "user", "The restaurant is close to the hotel."),
        shards=(FOOD, TRAVEL),
    )
    facts = of_kind(await extract(w), MemoryKind.FACT)
    # "restaurant" meets one word of each topic: a tie, kept in each shard once.
    assert sorted((f.shard_id, f.message_ids) for f in facts) == [("food", ("m0",)), ("travel", ("m0",))]
    # Two food words against one travel word: the food shard alone.
    w = window(("alice", "user", "The restaurant serves vegan dinner close to the hotel."), shards=(FOOD, TRAVEL))
    assert [(f.shard_id, f.content) for f in of_kind(await extract(w), MemoryKind.FACT)] == [
        ("food", "The restaurant serves vegan dinner close to the hotel.")]


async def test_a_shard_fact_is_topic_knowledge_without_speaker_or_filler():
    w = window(("bob", "user", "Oh, yeah, the hotel desk is shut on Mondays."), shards=(TRAVEL,))
    (fact,) = of_kind(await extract(w), MemoryKind.FACT)
    assert fact.content == "The hotel desk is shut on Mondays." and fact.user_id == "bob" and fact.message_ids == ("m0",)


async def test_long_fact_is_cut_to_30_words():
    sentence = "The deadline " + " ".join(f"depends on item{i}" for i in range(20)) + "."
    (fact,) = of_kind(await extract(window(("alice", "user", sentence), shards=(RELEASE,))), MemoryKind.FACT)
    assert words(fact.content) == 30
    assert fact.content.startswith("The deadline depends on item0")


# --- suggestions ---------------------------------------------------------------------


async def test_suggestion_keeps_rationale_and_who_agreed_or_disagreed():
    w = window(
        ("bob", "user", "We should ship on Friday because QA is done."),
        ("carol", "user", "Sounds good to me."),
        ("alice", "assistant", "Yes, good idea."),  # the assistant's assent is not a vote
        ("dave", "user", "I don't think that is wise, the docs are not ready."),
        ("bob", "user", "Yes!"),  # the proposer agreeing with himself does not count
        shards=(RELEASE, FOOD),
    )
    result = await extract(w)
    (suggestion,) = of_kind(result, MemoryKind.SUGGESTION)
    assert suggestion.content == (
        "bob suggested that the group should ship on Friday because QA is done (carol agreed; dave disagreed).")
    assert suggestion.shard_id == "release" and suggestion.user_id == "bob"
    assert suggestion.message_ids == ("m0", "m1", "m3")
    assert of_kind(result, MemoryKind.FACT) == []  # a suggestion is not also a fact
    check_invariants(w, result)


@pytest.mark.parametrize("cue", [
    "Let's ship the release on Friday.",
    "I suggest we ship the release on Friday.",
    "How about we ship the release on Friday?",
    "Why don't we ship the release on Friday?",
    "We could ship the release on Friday.",
    "I recommend shipping the release on Friday.",
    "Maybe we ship the release on Friday.",
])
async def test_suggestion_cues(cue):
    result = await extract(window(("bob", "user", cue), ("erin", "user", "+1"), shards=(RELEASE,)))
    (suggestion,) = of_kind(result, MemoryKind.SUGGESTION)
    assert suggestion.content.startswith(("bob suggested that the group ", "bob recommended "))
    assert "ship the release on Friday" in suggestion.content or "shipping the release" in suggestion.content
    assert suggestion.content.endswith("(erin agreed).")
    assert suggestion.message_ids == ("m0", "m1")


async def test_reactions_belong_to_the_latest_suggestion():
    w = window(
        ("bob", "user", "How about dinner at the vegan place on Friday?"),
        ("alice", "user", "Sounds good, I agree."),
        ("bob", "user", "We should book lunch at the market too."),
        ("alice", "user", "No, bad idea, the market is packed at noon."),
        ("carol", "user", "I disagree as well."),
        shards=(FOOD,),
    )
    got = [(s.content, s.message_ids) for s in of_kind(await extract(w), MemoryKind.SUGGESTION)]
    assert got == [
        ("bob suggested dinner at the vegan place on Friday (alice agreed).", ("m0", "m1")),
        ("bob suggested that the group should book lunch at the market too (alice, carol disagreed).", ("m2", "m3", "m4")),
    ]


async def test_a_negated_proposal_is_a_reaction_not_a_suggestion():
    w = window(
        ("bob", "user", "We should take the train to Sintra on June 4th."),
        ("alice", "user", "I don't think we should take the train that early."),
        shards=(TRAVEL,),
    )
    result = await extract(w)
    assert [(s.content, s.message_ids) for s in of_kind(result, MemoryKind.SUGGESTION)] == [
        ("bob suggested that the group should take the train to Sintra on June 4th (alice disagreed).", ("m0", "m1"))]


async def test_suggestions_only_for_matching_active_shards():
    w = window(
        ("bob", "user", "Let's take the night train."),
        ("bob", "user", "Let's paint the office green."),
        shards=(TRAVEL.model_copy(update={"active": False}), FOOD),
    )
    assert (await extract(w)).items == []


async def test_long_suggestion_keeps_its_verdicts_within_35_words():
    rationale = "We should ship on Friday because " + " ".join(f"reason{i}" for i in range(50)) + "."
    w = window(
        ("bob", "user", rationale),
        ("carol", "user", "Agreed."),
        ("dave", "user", "I disagree."),
        ("erin", "user", "+1"),
        shards=(RELEASE,),
    )
    (suggestion,) = of_kind(await extract(w), MemoryKind.SUGGESTION)
    assert words(suggestion.content) <= 35
    assert suggestion.content.startswith("bob suggested that the group should ship on Friday because reason0")
    assert suggestion.content.endswith("(carol, erin agreed; dave disagreed).")
    assert suggestion.message_ids == ("m0", "m1", "m2", "m3")


# --- the demo conversation and arbitrary windows ---------------------------------------


async def test_demo_conversation_extracts_the_expected_memories():
    data = json.loads((Path(__file__).parents[1] / "memory_service" / "data" / "demo_conversation.json").read_text())
    shards = tuple(Shard(agent_id=data["agent_id"], shard_id=k, **v) for k, v in data["shards"].items())
    session = next(s for s in data["sessions"] if s["session_id"] == "lisbon-planning-2026-05-10")
    w = window(*session["messages"], shards=shards)
    result = await extract(w)
    check_invariants(w, result)
    contents = {(i.kind, i.shard_id or i.user_id, i.content) for i in result.items}
    assert (MemoryKind.DIRECTIVE, "bob", "Remember that I'm allergic to peanuts when you pick restaurants.") in contents
    # It tells alice's diet, so it is kept for bob, who said it, not in the shared food shard.
    assert (MemoryKind.FACT, "bob", "bob suggested dinner at Ao 26 Vegan Food Project on the first evening, since "
            "Alice is vegetarian.") in contents
    assert not [i for i in result.items if i.shard_id and "vegetarian" in i.content]
    assert (MemoryKind.SUGGESTION, "travel", "bob suggested that the group should take the train to Sintra on June 4th "
            "because the palaces are less crowded on weekdays (alice agreed).") in contents
    # "That restaurant…" answers the turn before it: which restaurant is in that turn, so it is not stored.
    assert not [i for i in result.items if "Chiado" in i.content]
    assert (MemoryKind.FACT, "travel", "The 10:41 train from Rossio station works, and tickets cost 2.40 euros each way.") in contents
    assert result.episode and result.episode.startswith("bob: How about dinner at Ao 26")


_PHRASES = [
    "I prefer tea", "we should ship the release", "let's book a hotel", "the deadline is Friday",
    "yes", "no,", "I disagree", "sounds good", "call me Al", "what is the budget?", "  \n ",
    "always", "never mind", "QA", "dinner", "flights", "the hotel costs 140 euros", "+1",
    "I'm a", "remember that", "…", "Ünïcödé café", "!!!", "http://example.com/a.b?c=d",
]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(
    st.tuples(
        st.sampled_from(["alice", "bob", "Carol Smith"]),
        st.sampled_from(["user", "user", "assistant", "tool"]),
        st.lists(st.one_of(st.sampled_from(_PHRASES), st.text(max_size=40)), min_size=1, max_size=8)
        .map(lambda parts: ". ".join(parts)),
    ),
    max_size=12,
))
def test_any_window_respects_limits_and_provenance(lines):
    w = window(*lines, shards=(TRAVEL, FOOD, RELEASE, FOOD.model_copy(update={"shard_id": "off", "active": False})))
    result = asyncio.run(RuleBasedExtractor().extract(w))
    check_invariants(w, result)
    assert result == asyncio.run(RuleBasedExtractor().extract(w))
    assert all(i.shard_id != "off" for i in result.items)
