"""Offline, rule-based extraction: no model, no network, standard library only.

The default extractor for the demo, the tests and any deployment without an LLM. It reads
surface cues only, so it errs on the side of keeping less: a missed memory costs little,
a wrong one is shown to the model in every later prompt.

What it produces from one window (see DESIGN.md, "Memory kinds"):
- episode: the window's most informative sentences, each under its speaker, <= 50 words;
- directives: a user's own sentences stating a rule, preference or stable personal context;
- facts and suggestions: sentences on an active shard's topic, naming their source;
  suggestions also name who agreed or disagreed in the following messages;
- personal facts: a sentence on a shard's topic that is about a person ("my passport
  number is…", memory_service.formation.personal) goes to that person's namespace, never the shard.

Only user and assistant messages are read: system prompts are instructions, not
conversation, and tool output is raw data that would crowd out what people said.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache

from memory_service.domain.models import WORD_LIMITS, MemoryKind, Role, Shard
from memory_service.domain.text import stem
from memory_service.formation.extractor import ExtractedItem, Extraction, Window, WindowMessage
from memory_service.formation.personal import is_personal
from memory_service.formation.phrasing import is_pleasantry, proposal_as_fact, refers_back, third_person

__all__ = ["RuleBasedExtractor", "about_user", "content_words", "is_directive", "limit_words", "split_sentences",
           "statement_kind", "stem"]


def limit_words(text: str, n: int) -> str:
    """``text`` with white space collapsed and at most ``n`` words; a cut is marked with '…'.

    Words are white-space separated runs, the same count the word limits are checked with.
    The ellipsis is glued to the last kept word, so it never adds a word.
    """
    words = text.split()
    if len(words) <= n:
        return " ".join(words)
    if n <= 0:
        return ""
    return " ".join(words[:n]).rstrip(" ,;:-–—") + "…"


def _word_count(text: str) -> int:
    return len(text.split())


# --- words ---------------------------------------------------------------------------

# Function words, chat filler and bare verdicts ("sounds good"): they say nothing about a
# topic, so they neither score episode sentences nor match shards. Checked against the raw
# word and its stem. The letter pairs are what "3rd" or "7pm" leave behind.
STOP_WORDS = frozenset(
    """
    a about above after again against all am an and any are aren't as at be because been
    before being below between both but by can can't cannot could couldn't did didn't do
    does doesn't doing don't down during each few for from further had hadn't has hasn't
    have haven't having he he'd he'll he's her here here's hers herself him himself his how
    how's i i'd i'll i'm i've if in into is isn't it it's its itself let's me more most
    mustn't my myself no nor not of off on once only or other ought our ours ourselves out
    over own same shan't she she'd she'll she's should shouldn't so some such than that
    that's the their theirs them themselves then there there's these they they'd they'll
    they're they've this those through to too under until up very was wasn't we we'd we'll
    we're we've were weren't what what's when when's where where's which while who who's
    whom why why's will with won't would wouldn't you you'd you'll you're you've your yours
    yourself yourselves
    just also really maybe well okay ok yes yeah yep no nope hi hello hey thanks thank
    please sure oh like get got go going make made want need know think let lets shall may
    might must one thing stuff something anything everything lot bit now still even much
    many etc general misc topic info information related
    good great fine nice perfect lovely cool awesome sound sounds agree agreed idea noted
    understood right alright
    us am pm st nd rd th mr ms dr eg ie vs ah uh um hm
    """.split()
)

_WORD = re.compile(r"[a-z]+(?:'[a-z]+)*")


def content_words(text: str) -> list[str]:
    """Stems of the words in ``text`` that carry meaning, in order, repeats kept."""
    out = []
    for word in _WORD.findall(_normalise(text).lower()):
        if len(word) < 2 or word in STOP_WORDS:  # two letters: keep "QA", "UI", "DB"
            continue
        stemmed = stem(word)
        if stemmed not in STOP_WORDS:
            out.append(stemmed)
    return out


def _normalise(text: str) -> str:
    """Typographic quotes to ASCII, so that one pattern matches "don't" and "don’t"."""
    return text.replace("’", "'").replace("‘", "'").replace("“", '"').replace("”", '"')


# --- sentences -----------------------------------------------------------------------

# A sentence ends at . ! ? or … followed by white space (optionally after a closing quote
# or bracket), or at a line break; not after a title (Dr., Mr., Mrs., Ms., St., Prof.): "My doctor is
# Dr. Almeida" is one statement. Other abbreviations split wrongly; that costs little here.
_SENTENCE_BREAK = re.compile(
    r"(?<=[.!?…][\"')\]])\s+|(?<!\bDr\.)(?<!\bMr\.)(?<!\bMrs\.)(?<!\bMs\.)(?<!\bSt\.)(?<!\bProf\.)(?<=[.!?…])\s+|"
    r"\s*\n\s*"
)


def split_sentences(text: str) -> list[str]:
    """The sentences of ``text``, white space collapsed; pieces without a letter or digit dropped."""
    pieces = (" ".join(p.split()) for p in _SENTENCE_BREAK.split(text))
    return [p for p in pieces if any(ch.isalnum() for ch in p)]


@dataclass(frozen=True, slots=True)
class _Sentence:
    message: WindowMessage
    order: tuple[int, int]  # (message position in the window, sentence position in it)
    speaker: str  # user_id for users, "assistant" for the assistant
    text: str  # as written, white space collapsed
    norm: str  # typographic quotes normalised, for the patterns
    stems: tuple[str, ...]

    @property
    def is_user(self) -> bool:
        return self.message.role == Role.USER

    @property
    def is_question(self) -> bool:
        return self.norm.rstrip("\"')] ").endswith("?")


def _speaker(message: WindowMessage) -> str:
    if message.role == Role.USER:
        return message.user_id or "user"
    return "assistant"


def _lower_first(text: str) -> str:
    """'We should…' -> 'we should…' after a 'name:' prefix; names and 'I' keep their capital."""
    first = text.split(maxsplit=1)[0] if text.strip() else ""
    bare = re.sub(r"[^a-z']", "", _normalise(first).lower())
    if bare in STOP_WORDS and not bare.startswith("i'") and bare != "i" and first[:1].isupper() and not first.isupper():
        return text[0].lower() + text[1:]
    return text


def _key(text: str) -> str:
    """What two sentences must share to count as the same (case, punctuation and spacing ignored)."""
    return " ".join(re.findall(r"[a-z0-9]+", _normalise(text).lower()))


# --- directives ----------------------------------------------------------------------
#
# A directive is shown to the model in every later prompt, so a sentence has to earn it:
# it must say something that holds beyond this conversation turn. is_directive() decides,
# in two steps (docs/extraction.md gives the rule with examples and its measured quality):
#
# 1. Rejected whole: a question (unless it asks the assistant to do something always,
#    never or from now on), a hypothetical ("if I were…, I'd…", "imagine…"), anything tied
#    to one occasion (today, tomorrow, this time, on Saturday, last year, right now…), and
#    a cue that follows someone else's words ("my mom always said, never…").
# 2. Accepted if a clause starts with one of three shapes:
#    a. a standing preference of the user: "I prefer/like/love/hate… X" in the present
#       tense, where X is a kind of thing (a plural, a mass noun, a gerund, "to …", "my …")
#       rather than a particular thing just shown ("it", "that", "this", "the", "your",
#       "how…"): "I love hiking" is a preference, "I love that photo" a reaction; also
#       "I'd rather…", "I'm a big fan of…", "X is my favourite";
#    b. stable context about the user: a name, diet, health, age, occupation, home,
#       family and pets, or a habit in the present simple ("I work night shifts",
#       "I don't drink alcohol", "I never fly at night");
#    c. an instruction to the assistant that outlasts this reply: it carries a mark of
#       persistence, or its object is the replies in general. Marks: always/never/only/
#       don't ever with a verb naming something the assistant does for the user ("never
#       book red-eyes"; an everyday verb, "always use fresh yeast", only with the user,
#       the replies or "you"), "from now on", "in future", "whenever/every time/when you
#       <verb>…", "stop <doing>…", "remember that I…", a prohibition of a style of reply
#       ("don't use emojis", "avoid jargon"), how to address or treat the user ("call me
#       Ali", "talk to me like a friend"). The replies in general: a plural or "every"
#       reply as the object or the place ("keep answers short", "keep your explanations
#       simple", "… in your replies").
# Everything else is not a directive. A request for this turn's task is not one, however
# it asks the reply to look ("Please answer point by point", "write 5 bullet points…",
# "reply in Spanish so my mother can read this one", "can you suggest … in an earthy
# tone?"), nor a conditional preference for the choice at hand ("I'd prefer something
# around eight weeks long"); pleasantries ("always good chatting with you"),
# encouragement ("never give up!"), compliments and other people's habits have no cue.
# Only the user's sentences are read: the assistant's advice is never the user's rule.

_WEEKDAY = r"(?:monday|tuesday|wednesday|thursday|friday|saturday|sunday)"
_MONTH = (r"(?:january|february|march|april|may|june|july|august|september|october|november|"
          r"december)")

# "If I were rich I'd always fly business", "imagine never working again": a condition
# followed by would/could, or a sentence opening with imagine/suppose.
_IMAGINE = re.compile(r"^\W*(?:imagine|suppose|supposing|what\s+if|pretend)\b", re.IGNORECASE)
_IF = re.compile(r"\b(?:if|unless)\b", re.IGNORECASE)
_WOULD = re.compile(r"\b(?:i'd|would|i'll|could)\b", re.IGNORECASE)
# One occasion: a day, a time, this trip. Weekdays count only in the singular with a
# preposition ("on Saturday"), so "I work from home on Fridays" stays a habit.
_ONE_OCCASION = re.compile(
    r"\b(?:today|tonight|tomorrow|yesterday|right\s+now|just\s+now|for\s+now|at\s+the\s+moment|"
    r"later\s+today|someday|one\s+day(?!\s+(?:a|per|each)\b)|"
    r"this\s+(?:morning|afternoon|evening|time|once|week|weekend|month|year|trip|flight|visit)|"
    r"next\s+(?:week|weekend|month|year|time|" + _WEEKDAY + r")|"
    r"last\s+(?:night|week|weekend|month|year|time|summer|winter|spring|autumn|fall|" + _WEEKDAY + r")|"
    r"(?:on|by|until|till|this|coming)\s+" + _WEEKDAY + r"(?!s)|"
    r"(?:\w+\s+)(?:days?|weeks?|months?|years?)\s+ago|in\s+(?:19|20)\d\d)\b",
    re.IGNORECASE,
)
# A date is one occasion too, unless it comes back every year.
_DATE = re.compile(
    r"\b(?:\d{1,2}(?:st|nd|rd|th)?\s+(?:of\s+)?" + _MONTH + r"|" + _MONTH + r"\s+\d{1,2}(?:st|nd|rd|th)?)\b",
    re.IGNORECASE,
)
_RECURRING = re.compile(r"\b(?:birthday|anniversary|every|each)\b", re.IGNORECASE)
# Someone else's words: a cue after one of these is quoted, not said by the user ("I said
# I prefer aisle seats" restates the user's own).
_REPORTED = re.compile(
    r"(?<!\bi )\b(?:said|says|say|saying|told|tells|telling|asked|asks|wrote|writes|quote|quoting|"
    r"according\s+to|claims?|claimed|reckons?)\b",
    re.IGNORECASE,
)

# A clause starts the sentence, follows , ; : ( or a dash, or follows a joining word; the
# filler words opening it ("so", "oh", "please", "honestly,") are skipped.
_CLAUSE_BREAK = re.compile(
    r"[,;:(]\s*|\s[-–—]\s*|\b(?:and|but|so|because|since|cause|cos|though|although|as|plus|then)\s+",
    re.IGNORECASE,
)
_FILLER = re.compile(
    r"(?:(?:and|but|so|also|then|plus|btw|oh|well|actually|ok|okay|hi|hey|hello|honestly|anyway|"
    r"anyways|seriously|personally|fyi|yes|yeah|yep|sure|alright|please|pls|plz|kindly|just|"
    r"(?:no|nah),)[,!]?\s+)*",
    re.IGNORECASE,
)


def _filler_end(text: str, pos: int = 0) -> int:
    """Where the filler words at ``pos`` end (``_FILLER`` matches the empty string too)."""
    m = _FILLER.match(text, pos)
    return m.end() if m else pos

# What a preference is about. A particular thing ("it", "that photo", "the blue one",
# "your dog", "how you said it") makes it a reaction; a kind of thing makes it a preference.
_REFERS_BACK = frozenset(
    "it its it's that that's this these those them they you your yours ya u ur him her his "
    "their em 'em".split()
)
_PARTICULAR = _REFERS_BACK | frozenset(
    "the how what where when who which why both either neither one ones all everything "
    "everyone everybody here there so".split()
)
_ADVERB = (
    r"(?:really|also|usually|generally|always|just|much|strongly|definitely|do|truly|absolutely|"
    r"actually|honestly|totally|still|mostly|normally|typically|genuinely|personally|kind\s+of|"
    r"kinda|sort\s+of|quite|never|only|rarely|seldom|often|sometimes|mainly|currently|even|"
    r"don't|dont|do\s+not|can't|cant|cannot)"
)
_I = r"i\s+(?:" + _ADVERB + r"\s+)*"
_I_AM = r"(?:i'm|i\s+am|im)\s+"
_PREFERENCE = re.compile(
    _I + r"(?P<verb>prefer|like|love|adore|enjoy|hate|dislike|detest|loathe|stand)\b", re.IGNORECASE
)
_WOULD_RATHER = re.compile(
    r"i(?:'d|\s+would)\s+(?:(?:much|really|honestly|definitely|actually|generally|always)\s+)*"
    r"(?:prefer|rather)\b",
    re.IGNORECASE,
)
_INTO = re.compile(_I_AM + r"(?:(?:really|so|very|totally|super|not|also|big|huge)\s+)*into\b", re.IGNORECASE)
# "Painting is my passion", "spicy food is my weakness" -- not "that's my favourite".
_IS_MY_FAVOURITE = re.compile(
    r"(?P<subject>[a-z][\w'-]*)(?:\s+[a-z][\w'-]*){0,2}?\s*(?:\s+is|\s+are|'s)\s+"
    r"(?:(?:really|definitely|totally|honestly|basically|always|still)\s+)*my\s+"
    r"(?:absolute\s+|all-time\s+|biggest\s+|true\s+|greatest\s+)?"
    r"(?:favou?rite|passion|thing|jam|weakness|go-to|guilty\s+pleasure)\b",
    re.IGNORECASE,
)

# Present-simple activities: in the first person they describe a habit ("I work nights",
# "I don't drink", "I never fly at night"). Their past forms are not listed.
_HABIT = re.compile(
    _I + r"(?P<verb>work|teach|study|live|use|speak|drive|own|run|cycle|bike|swim|cook|bake|eat|"
    r"drink|smoke|play|practise|practice|volunteer|commute|travel|fly|sleep|wake|wear|read|"
    r"watch|listen|code|program|go\s+to\s+bed|get\s+up|follow|keep\s+kosher|fast)\b",
    re.IGNORECASE,
)
_HOUSEHOLD = (
    r"(?:kids?|children|child|sons?|daughters?|bab(?:y|ies)|toddlers?|twins|teenagers?|"
    r"grand(?:children|kids|sons?|daughters?)|wife|husband|partner|spouse|boyfriend|girlfriend|"
    r"fianc[eé]e?|mum|mom|mother|dad|father|parents|dogs?|cats?|pets?|pupp(?:y|ies)|kittens?|"
    r"horses?|rabbits?|parrots?)"
)
_CONDITION = (
    r"(?:allerg(?:y|ies)|intolerances?|diabetes|asthma|epilepsy|migraines|coeliac|celiac|"
    r"disability|phobia|bad\s+(?:back|knee|knees|hip)|heart\s+condition|condition)"
)
_HAVE = re.compile(
    r"i(?:\s+(?:also|only|still|just|don't|do\s+not))*(?:\s+have|'ve|\s+have)(?:\s+got)?\s+"
    r"(?:(?!(?:about|for|with|of|to|in|on|at|from|my|your|the|a\s+question)\b)[\w'-]+\s+){0,3}?"
    + "(?:" + _HOUSEHOLD + "|" + _CONDITION + r")\b",
    re.IGNORECASE,
)
# Traits that last: diet, health, body, faith, family status.
_TRAIT = (
    r"(?:vegetarian|vegan|pescatarian|pescetarian|allergic|lactose|gluten|intolerant|diabetic|"
    r"pre-?diabetic|coeliac|celiac|asthmatic|epileptic|deaf|blind|colou?r[- ]?blind|"
    r"hard\s+of\s+hearing|dyslexic|autistic|left-handed|right-handed|pregnant|married|engaged|"
    r"single|divorced|widowed|retired|unemployed|self-employed|freelance|teetotal|sober|kosher|"
    r"halal|muslim|jewish|christian|catholic|hindu|buddhist|sikh|atheist|disabled|"
    r"claustrophobic|afraid\s+of|scared\s+of|terrified\s+of|bilingual|fluent\s+in)\b(?!-[a-z]*ly\b)"
)
_STATE = re.compile(
    _I_AM + r"(?:(?:also|very|severely|mildly|originally|not|actually|really|definitely|strictly|"
    r"fully|totally|completely|kind\s+of|kinda|mostly|partially|basically|still|now|so|quite|"
    r"extremely|deathly|super|currently)\s+)*"
    r"(?:" + _TRAIT + r"|(?:based|located|living)\s+in\b|from\s+(?-i:[A-Z]))",
    re.IGNORECASE,
)
_AGE = r"(?:\d{1,2}|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|" \
       r"fourteen|fifteen|sixteen|seventeen|eighteen|nineteen|(?:twenty|thirty|forty|fifty|" \
       r"sixty|seventy|eighty)(?:[- ][a-z]+)?)(?:\s+(?:years?|months?)\s+old|\s*y/?o\b)?" \
       r"(?=\s*(?:$|[,.!;]|and\b|but\b|so\b))"
_I_AM_AGE = re.compile(_I_AM + _AGE, re.IGNORECASE)
# "I'm a nurse", "I'm not a morning person", "I'm a big fan of jazz" -- but not "I'm a bit
# tired", "I'm a big fan of your work", nor a verdict on oneself ("I'm an idiot", "I'm a
# genius!": an exclamation is a reaction).
_I_AM_A = re.compile(
    _I_AM + r"(?:(?:also|not|actually|really|originally|basically|still|just|now|currently|"
    r"proudly)\s+)*(?:a|an)\s+"
    r"(?!(?:bit|little|lot|moment|sec|second|minute|mess|wreck|idiot|genius|fool|dummy|moron|"
    r"disaster|legend|natural|lucky|happy|proud)\b|(?:big\s+|huge\s+)?fan\b(?!\s+of))(?P<rest>.*)",
    re.IGNORECASE,
)
# An activity taken up and still going on: "I just started learning the violin", "I'm
# training for a marathon", "I took up pottery".
_TAKEN_UP = re.compile(
    r"(?:i\s+(?:(?:just|recently|finally|also)\s+)*(?:started|began|took\s+up|have\s+started|'ve\s+started)\s+"
    r"(?:learning|taking|playing|studying|training|practi[cs]ing|going\s+to|doing|(?!(?:it|that|this|to)\b)[a-z]+\b(?<!ed))|"
    + _I_AM + r"(?:(?:now|currently|still|also)\s+)*(?:learning|training\s+for|studying)\b)",
    re.IGNORECASE,
)
_OF_PARTICULAR = re.compile(r"\bof\s+(?:it|that|this|these|those|them|your|yours|the|you)\b", re.IGNORECASE)
_HOUSEHOLD_TRAIT = re.compile(
    r"my\s+" + _HOUSEHOLD + r"(?:\s+(?-i:[A-Z])\w+)?\s*(?:\s+is|\s+are|'s)\s+"
    r"(?:(?:also|severely|very|strictly|deathly|only|just|now)\s+)*"
    r"(?:" + _TRAIT + r"|(?:a|an)\s+(?:vegetarian|vegan|diabetic|coeliac|celiac)\b|" + _AGE + ")",
    re.IGNORECASE,
)
_NAME = re.compile(
    r"(?:(?:you\s+can|you\s+may|just|everyone|everybody|people|friends|my\s+friends|most\s+people)\s+)*"
    r"calls?\s+me\s+\"?(?!(?-i:[A-Z]{2,})\b|" + _WEEKDAY + r"\b|" + _MONTH + r"\b)(?-i:[A-Z])"
    r"|my\s+(?:(?:first|last|full|real|middle|given|family)\s+)?name(?:\s+is|'s)\b"
    r"|my\s+(?:pronouns|nickname)\s+(?:are|is)\b"
    r"|i\s+go\s+by\b|(?:i'm|i\s+am)\s+called\s+(?-i:[A-Z])"
    r"|(?:i'm|i\s+am)\s+(?!" + _WEEKDAY + r"\b|" + _MONTH + r"\b)(?-i:[A-Z][a-z]+)(?:\s+(?-i:[A-Z][a-z]+))?"
    r"\s*(?:$|[,.;!]|and\b)"
    r"|(?:address|refer\s+to)\s+me\s+as\b",
    re.IGNORECASE,
)
_MY_FACT = re.compile(
    r"my\s+(?:birthday|email(?:\s+address)?|phone\s+number|home\s*town|profession|occupation|"
    r"native\s+language|first\s+language|mother\s+tongue|time\s*zone|diet|"
    r"(?:absolute\s+|all-time\s+)?favou?rite\s+[a-z]+(?:\s+[a-z]+)?)(?:\s+is|\s+are|'s)\b",
    re.IGNORECASE,
)
_REMEMBER = re.compile(
    r"(?:remember|keep\s+in\s+mind|bear\s+in\s+mind|don't\s+forget|do\s+not\s+forget|"
    r"for\s+the\s+record)(?:\s+that)?\s*,?\s+(?:i|i'm|i've|im|my)\b",
    re.IGNORECASE,
)

# Instructions. SERVICE verbs name what an assistant does for the user, so "always/never
# <verb>" with one is a standing rule ("never book red-eyes"). MANNER verbs are as often
# advice to a friend ("never give up", "always be yourself"), so they need the user ("give
# me two options") or the assistant's replies ("be blunt with me") as their object. NAMING
# verbs with "me" say how to address the user.
_SERVICE = frozenset(
    "book reserve schedule order suggest recommend propose remind send email text message ping "
    "notify contact show list include mention answer reply respond write explain translate "
    "summarise summarize format use assume ask check double-check confirm cite pick choose plan "
    "add cc share round convert keep avoid put wake default offer provide quote label sort "
    "prioritise prioritize flag warn alert".split()
)
_MANNER = frozenset(
    "be stop quit speak talk give tell make start begin end skip stick treat say go try sound act".split()
)
_NAMING = frozenset("call address refer spell".split())
# Service verbs as often said of anyone's life as of the assistant's work ("always use
# fresh yeast", "always keep ripe fruit in the fridge", a pasted house rule): with
# always/never they are the assistant's rule only when the clause names the user, the
# replies or "you", or when said to the assistant ("I want you to always check…").
_EVERYDAY = frozenset(
    "use keep avoid put wake add check double-check plan pick choose round convert sort label share offer "
    "provide default order".split()
)
# Verbs of how the assistant treats the user ("talk to me like a friend", "be more direct
# with me"): how to treat someone holds beyond one reply.
_TREAT = frozenset("be talk speak treat act sound".split())
_TOWARD_ME = re.compile(r"\s*(?:[a-z-]+\s+){0,3}?(?:with\s+me|to\s+me\s+(?:like|as)|me\s+(?:like|as))\b", re.IGNORECASE)
_LANGUAGE = (
    r"(?:english|spanish|french|german|portuguese|italian|dutch|polish|russian|chinese|mandarin|"
    r"cantonese|japanese|korean|arabic|hindi|turkish|greek|swedish|norwegian|danish|finnish|czech|"
    r"hungarian|romanian|ukrainian|hebrew|vietnamese|indonesian|catalan|welsh|irish|plain\s+\w+|"
    r"simple\s+(?:terms|words|language))"
)
# The form of the assistant's replies.
_REPLY_FORM = re.compile(
    r"\b(?:answers?|repl(?:y|ies)|responses?|explanations?|summar(?:y|ies)|tone|spelling|units|"
    r"metric|imperial|celsius|fahrenheit|emojis?|emoticons?|jargon|acronyms|bullet(?:\s+points?|s)|"
    r"headings|formatting|code\s+(?:examples?|snippets?|samples?)|exclamation\s+marks?|swearing|"
    r"profanity|caveats|disclaimers|with\s+me|in\s+" + _LANGUAGE + r")\b",
    re.IGNORECASE,
)
# The assistant's replies in general, not this one: a plural or "every" reply as the
# object ("keep answers short", "keep your explanations simple", "write all code examples
# in Python") or as where it goes ("… in your replies", "at the end of every answer").
# "the answers", "a summary", "your response" are this reply's.
_REPLY_NOUNS = r"(?:answers|replies|responses|explanations|summaries|code\s+(?:examples|snippets|samples))"
_GENERAL = r"(?:your|all(?:\s+(?:of\s+)?your)?)\s+(?:[a-z-]+\s+)?"
_REPLIES_OBJECT = re.compile(r"\s*(?:me\s+)?(?:" + _GENERAL + r")?" + _REPLY_NOUNS + r"\b", re.IGNORECASE)
_REPLIES_PLACE = re.compile(
    r"\b(?:in|from|of|to|with|on)\s+(?:" + _GENERAL + _REPLY_NOUNS + r"|(?:every|each)\s+(?:answer|reply|response|message))\b",
    re.IGNORECASE,
)
# A style of reply (not its content or layout): forbidding one holds for every reply
# ("don't use emojis", "avoid jargon"); asking for a layout (bullet points, a table, a
# tone, a language) is this reply's.
_STYLE = re.compile(
    r"\b(?:emojis?|emoticons?|jargon|acronyms|exclamation\s+marks?|swearing|profanity|caveats|disclaimers)\b",
    re.IGNORECASE,
)
# Habitual clauses about the assistant: "whenever you suggest…", "when you explain things".
_WHEN_YOU = re.compile(
    r"\b(?:when|whenever|every\s+time|each\s+time|any\s*time)\s+you\s+(?P<verb>[a-z]+(?:-[a-z]+)?)\b"
    r"(?!\s+(?:the|this|that|it|these|those)\b)",
    re.IGNORECASE,
)
# A conditional preference ("I'd prefer…", "I'd rather…") is a choice among the options at
# hand; it stands only with a mark that it holds in general.
_IN_GENERAL = re.compile(
    r"\b(?:always|generally|in\s+general|usually|normally|as\s+a\s+rule|whenever|every\s+time|"
    r"from\s+now\s+on|in\s+(?:the\s+)?future)\b",
    re.IGNORECASE,
)
# A preference about the assistant's doings or replies is how it should act (read up to the
# clause's end: "I like number 2 - write the summary…" likes an option, not a kind of reply).
_CLAUSE_END = re.compile(r"[,;:(]|\s[-–—]\s")
_ABOUT_ASSISTANT = re.compile(r"\b(?:you|your|yours)\b|" + _REPLY_FORM.pattern, re.IGNORECASE)
_ADDRESS_ME = re.compile(
    r"(?:(?:you\s+(?:can|may)|just|please)\s+)*call\s+me\b|(?:address|refer\s+to)\s+me\s+as\b", re.IGNORECASE
)
_ABOUT_ME = re.compile(r"\b(?:me|my|i|i'm|mine)\b", re.IGNORECASE)
_PARTICULAR_OBJECT = re.compile(r"^\s*(?:\w+\s+)?(?:the|this|that|these|those|it)\b", re.IGNORECASE)
_IMPERATIVE = re.compile(
    r"(?P<mod>always|never(?:\s+ever)?|only|don't\s+ever|dont\s+ever|do\s+not\s+ever|no\s+longer|"
    r"don't|dont|do\s+not|didn't|did\s+not|wouldn't|would\s+not|stop|quit)?\s*(?P<verb>[a-z]+(?:-[a-z]+)?)\b",
    re.IGNORECASE,
)
_HABITUAL_MOD = ("always", "never", "never ever", "only", "don't ever", "dont ever", "do not ever", "no longer")
# Markers that make whatever follows a standing rule.
_FROM_NOW_ON = re.compile(
    r"\b(?:from\s+now\s+on|going\s+forward|from\s+here\s+on(?:\s+out)?|for\s+all\s+future|"
    r"for\s+future\s+reference)\b",
    re.IGNORECASE,
)
# "I'm going to exercise more from now on" is the user's resolution, not a rule for the assistant.
_OWN_RESOLUTION = re.compile(r"\W*(?:i|i'm|i'll|i've|i'd|im|we|we're|we'll|my|our)\b", re.IGNORECASE)
_EVERY_TIME = re.compile(
    r"(?:whenever|every\s+time|each\s+time|any\s*time|in\s+(?:the\s+)?future,?)\s+(?:you\s+)?"
    r"(?:(?:always|never|please|also|just|don't|do\s+not)\s+)*(?P<verb>[a-z]+(?:-[a-z]+)?)\b",
    re.IGNORECASE,
)
_REQUEST = re.compile(
    r"i\s+(?:(?:really|just|also)\s+)*(?:want|need|would\s+like|would\s+love|would\s+prefer)\s+you\s+to\s+"
    r"|i'd\s+(?:(?:really|just|also)\s+)*(?:like|love|prefer)\s+(?:it\s+if\s+)?you\s+(?:to\s+)?"
    r"|(?:can|could|would|will)\s+you\s+(?:please\s+)?",
    re.IGNORECASE,
)
_NO_MORE = re.compile(
    r"no\s+(?!(?:problem|problems|worries|worry|way|idea|thanks|thank|clue|doubt|wonder|kidding|"
    r"joke|matter|one|body|rush|pressure|need|big|offense|offence|pun|comment|luck|chance|time|"
    r"sweat|biggie|hard|more|less|longer|question|questions)\b)[a-z]+"
    r".*\b(?:please|for\s+me|ever|anymore|any\s+more|(?:before|after)\s+\d)",
    re.IGNORECASE,
)


# Only the start of a clause is read: a directive says what it is in its first words,
# and reading a bounded stretch keeps a long run-on message linear to check.
CLAUSE_CHARS = 240


def _hypothetical(text: str) -> bool:
    if _IMAGINE.match(text):
        return True
    condition = _IF.search(text)
    return bool(condition and _WOULD.search(text, condition.end()))


def _first_word(text: str) -> str:
    match = re.match(r"[^\w.!?;]*([\w']+)", text)  # past quotes and brackets: 'I prefer "short" answers'
    return match.group(1).lower() if match else ""


def _kind_of_thing(text: str) -> bool:
    """The object right after a preference verb names a kind of thing, not one just shown."""
    word = _first_word(text)
    return bool(word) and word not in _PARTICULAR


def _verb_base(word: str) -> set[str]:
    """'calling' -> {'call', 'calle'}; 'using' -> {'us', 'use'}: enough to look a gerund up."""
    word = word.lower()
    if word.endswith("ing") and len(word) > 5:
        stem = word[:-3]
        return {stem, stem + "e", stem[:-1] if stem[-1:] == stem[-2:-1] else stem}
    return {word}


def _standing_instruction(clause: str, addressed: bool = False) -> bool:
    """An imperative (after "please", or after "I want you to", "could you": ``addressed``)
    that outlasts this reply: it carries a mark of persistence or is about the replies in
    general (the rule above). A request for this turn's task is not one."""
    match = _IMPERATIVE.match(clause)
    verb = match.group("verb").lower() if match else ""
    # "From now on, use metric units", "keep things brief from now on"; not "I'll track my
    # moods from now on" (the user's own resolution) nor a clause that only ends with it.
    if (m := _FROM_NOW_ON.search(clause)) and not _OWN_RESOLUTION.match(clause) and (
            m.start() == 0 or verb in _SERVICE | _MANNER | _NAMING):
        return True
    if not match:
        return False
    mod = " ".join((match.group("mod") or "").lower().split())
    rest = clause[match.end():]
    about_me = bool(_ABOUT_ME.search(rest))
    about_replies = bool(_REPLY_FORM.search(clause))
    general = bool(_REPLIES_OBJECT.match(rest) or _REPLIES_PLACE.search(clause))
    habitual = bool((m := _WHEN_YOU.search(rest)) and m.group("verb").lower() in _SERVICE | _MANNER)
    if mod in _HABITUAL_MOD:  # "always reply in Spanish", "never give me more than two options"
        if verb in _EVERYDAY:  # "always use fresh yeast" may be anyone's advice
            return addressed or about_me or about_replies or bool(re.search(r"\b(?:you|your)\b", rest, re.IGNORECASE))
        return verb in _SERVICE or ((verb in _MANNER or verb in _NAMING) and (about_me or about_replies))
    if mod in ("stop", "quit"):  # a habit ended: "stop apologizing in your answers", "stop calling me buddy"
        if not verb.endswith("ing"):  # "stop and wait for…" is this turn's
            return False
        return about_replies or (about_me and bool(_verb_base(verb) & (_SERVICE | _NAMING)))
    if _PARTICULAR_OBJECT.match(rest):  # "don't send me the file", "keep it short": this one
        return False
    if mod:  # "don't use emojis", "don't call me sir", "(I'd prefer it if you) didn't…"
        return (
            (verb in _NAMING and about_me)
            or (verb in _SERVICE and bool(_STYLE.search(rest)))
            or (verb in _SERVICE and verb not in _EVERYDAY and about_me)
            or ((verb in _SERVICE or verb in _MANNER) and (general or habitual))
        )
    # A plain imperative is this turn's task ("book the 9am train", "answer point by point",
    # "write 5 bullet points…"), unless it is about the replies in general ("keep answers
    # short"), says when it applies ("avoid jargon when you explain things"), forbids a
    # style ("avoid emojis") or says how to treat the user ("talk to me like a friend").
    if verb == "avoid" and _STYLE.search(rest):
        return True
    if verb in _TREAT and _TOWARD_ME.match(rest):
        return True
    return (verb in _SERVICE or verb in _MANNER) and (general or habitual)


_JOINED = re.compile(r"(?<![,;])\s(?:and|or)\s+", re.IGNORECASE)


def _clause_starts(text: str) -> list[int]:
    starts = [0] + [m.end() for m in _CLAUSE_BREAK.finditer(text)]
    return sorted({_filler_end(text, s) for s in starts})


DIRECTIVE = "directive"  # how the assistant should act
ABOUT_USER = "fact"  # a standing statement about the user: a fact in the user's namespace


def _clause_kind(clause: str) -> str | None:
    """What a clause states as it starts: how the assistant should act (``DIRECTIVE``),
    something lasting about the user (``ABOUT_USER``), or neither (None)."""
    if m := _REQUEST.match(clause):  # "I'd like you to…", "I'd prefer it if you…": for every reply?
        return DIRECTIVE if _standing_instruction(clause[m.end():], addressed=True) else None
    if m := _PREFERENCE.match(clause):
        negated = bool(re.search(r"\b(?:can't|cant|cannot)\s+stand\b", clause[: m.end()], re.IGNORECASE))
        if m.group("verb").lower() == "stand" and not negated:
            return None
        if not _kind_of_thing(clause[m.end():]):
            return None
        # "prefer" chooses between options the assistant picks from; a like or dislike of
        # the assistant's replies or doings ("I like short answers", "…when you book") is
        # about how it acts; any other like is about the user ("I love hiking").
        if m.group("verb").lower() == "prefer" or _ABOUT_ASSISTANT.search(_CLAUSE_END.split(clause, maxsplit=1)[0]):
            return DIRECTIVE
        return ABOUT_USER
    if m := _WOULD_RATHER.match(clause):
        if not _IN_GENERAL.search(clause):  # "I'd prefer something around eight weeks long": this choice
            return None
        rest = clause[m.end():]
        if _first_word(rest) == "not":  # "I'd rather not." / "I'd rather not, it's late" answer a proposal
            return DIRECTIVE if re.match(r"\s*not\s+[a-z]", rest, re.IGNORECASE) else None
        return DIRECTIVE if _kind_of_thing(rest) else None
    if m := _INTO.match(clause):
        return ABOUT_USER if _kind_of_thing(clause[m.end():]) else None
    if m := _IS_MY_FAVOURITE.match(clause):
        return ABOUT_USER if m.group("subject").lower() not in _PARTICULAR | {"he", "she", "we", "they", "you"} else None
    if m := _HABIT.match(clause):
        # "I fly to Rome" is a trip; "I never fly at night", "I always travel light" are habits.
        if m.group("verb").lower() in ("fly", "travel") and len(clause[: m.start("verb")].split()) < 2:
            return None
        return ABOUT_USER if _first_word(clause[m.end():]) not in _REFERS_BACK else None
    if _HAVE.match(clause) or _STATE.match(clause) or _I_AM_AGE.match(clause) or _TAKEN_UP.match(clause):
        return ABOUT_USER
    if m := _I_AM_A.match(clause):
        if _OF_PARTICULAR.search(m.group("rest")) or clause.rstrip("\"') ").endswith("!"):
            return None
        return ABOUT_USER
    if _ADDRESS_ME.match(clause):  # "call me Sam": how to address the user
        return DIRECTIVE
    if _HOUSEHOLD_TRAIT.match(clause) or _NAME.match(clause) or _MY_FACT.match(clause):
        return ABOUT_USER
    if _REMEMBER.match(clause) or _NO_MORE.match(clause):
        return DIRECTIVE
    if m := _EVERY_TIME.match(clause):
        verb = m.group("verb").lower()
        return DIRECTIVE if verb in _SERVICE or verb in _MANNER or verb in _NAMING else None
    return DIRECTIVE if _standing_instruction(clause) else None


def _follows_from(clause: str) -> bool:
    """After something about the user, an instruction it leads to: "I work night shifts, so
    don't message before noon" (no "me" needed: the user's context says whom it is for)."""
    m = _IMPERATIVE.match(clause)
    return bool(m and m.group("mod") and (m.group("verb") or "").lower() in _SERVICE | _MANNER)


def statement_kind(sentence: str) -> str | None:
    """``DIRECTIVE``, ``ABOUT_USER`` or None for one sentence of a user (the rule above).

    A sentence with both ("I work night shifts, so don't message before noon") is a
    directive: it says how to act, and why.
    """
    text = " ".join(_normalise(sentence).split())
    if not text or refers_back(text):
        return None
    if text.rstrip("\"')] ").endswith("?"):
        # Only a request about every later reply: "Could you always answer in bullet points?"
        start = _filler_end(text)
        m = _REQUEST.match(text, start)
        standing = m is not None and not _hypothetical(text) and _standing_instruction(text[m.end():m.end() + CLAUSE_CHARS], addressed=True)
        return DIRECTIVE if standing else None
    if _hypothetical(text) or _ONE_OCCASION.search(text):
        return None
    if _DATE.search(text) and not _RECURRING.search(text):
        return None
    reported = _REPORTED.search(text)
    found = None
    # "I need a plan to call home and send messages": after a first-person subject, a verb
    # joined by a bare "and"/"or" shares that subject; it is no instruction.
    continued = {m.end() for m in _JOINED.finditer(text)} if _OWN_RESOLUTION.match(text) else set()
    for start in _clause_starts(text):
        if reported and reported.start() < start:
            break  # everything from here on may be someone else's words
        clause = text[start:start + CLAUSE_CHARS]
        if start in continued and not _OWN_RESOLUTION.match(clause):
            continue
        kind = _clause_kind(clause)
        if kind == DIRECTIVE or (found == ABOUT_USER and _follows_from(clause)):
            return DIRECTIVE
        found = found or kind
    return found


def is_directive(sentence: str) -> bool:
    """Whether one sentence of a user says how the assistant should act."""
    return statement_kind(sentence) == DIRECTIVE


def about_user(sentence: str) -> bool:
    """Whether one sentence of a user states something lasting about them (and no directive)."""
    return statement_kind(sentence) == ABOUT_USER


# --- cues ----------------------------------------------------------------------------


# A proposal, question-shaped or not. "I don't think we should…" rejects a proposal and is
# a reaction, not a new one.
_SUGGESTION = re.compile(
    r"(?<!n't think )(?<!not think )(?<!not sure )"
    r"\b(?:we\s+should|let's|i\s+suggest|i'd\s+suggest|i\s+would\s+suggest|i\s+propose|"
    r"i\s+recommend|i'd\s+recommend|how\s+about|why\s+don't\s+we|we\s+could(?!\s+not)|"
    r"maybe\s+we|shall\s+we)\b",
    re.IGNORECASE,
)
_AGREE = re.compile(
    r"\bagreed?\b|\b(?:yes|yeah|yep|sounds\s+good|sounds\s+great|good\s+idea|great\s+idea|"
    r"let's\s+do\s+(?:it|that)|works\s+for\s+me|fine\s+by\s+me|deal)\b|(?<!\w)\+1(?!\d)",
    re.IGNORECASE,
)
_DISAGREE = re.compile(
    r"\b(?:disagree|don't\s+agree|do\s+not\s+agree|i\s+don't\s+think|i\s+do\s+not\s+think|"
    r"bad\s+idea|not\s+a\s+good\s+idea|i'd\s+rather\s+not)\b|(?:^|[.!?]\s+)(?:no|nope|nah)\b",
    re.IGNORECASE,
)
# The assistant's acknowledgements and promises ("Noted: …", "I will …") echo or serve the
# user; they are not knowledge about the topic.
_ASSISTANT_SMALL_TALK = re.compile(
    r"^\W*(?:(?:noted|understood|got\s+it|sure|ok|okay|of\s+course|certainly)\b|i\b|i'(?:ll|m|ve|d)\b)",
    re.IGNORECASE,
)

# How many following messages may hold reactions to a suggestion.
REACTION_LOOKAHEAD = 4
# Episode sentences from users count this much more than the assistant's, which often
# only restate what the user said.
USER_WEIGHT = 1.5
# Names, numbers and dates ("Lake Tahoe", "10:41", "June 4th") weigh in an episode as if
# said at least this many times in the window.
CONCRETE_MIN_COUNT = 2
# Words of greetings, thanks, farewells and compliments: they say nothing about what
# happened, so an episode sentence made of them ("Take care!", "Always a pleasure.") is
# not worth its words.
_EPISODE_FILLER = frozenset(
    stem(w)
    for w in """
    always never anytime welcome pleasure care glad happy proud amazing wonderful fantastic awesome
    beautiful cute wow haha lol omg love loved lovely thank thanks cheers bye goodbye congrats
    congratulations hope luck soon miss chat chatting talk talking fun help""".split()
)
_NAMED = frozenset(("i", "i'm", "i'd", "i've", "i'll"))
_CALENDAR = re.compile(r"^(?:" + _WEEKDAY + "|" + _MONTH + r")s?$", re.IGNORECASE)
_NUMBER = re.compile(r"\d+(?:[.:,/]\d+)*(?:st|nd|rd|th|am|pm|h|k|%)?", re.IGNORECASE)


def _episode_units(sentence: _Sentence) -> tuple[tuple[str, ...], int]:
    """What an episode sentence says: its content words minus chat formulas, plus its
    concrete tokens ('#'-prefixed): numbers, and capitalised words past the first (names);
    and how many distinct things that is (a name counts once, though it is in both)."""
    words = [w for w in sentence.stems if w not in _EPISODE_FILLER]
    tokens = re.findall(r"[\w'-]+", sentence.norm)
    concrete = [m.lower() for m in _NUMBER.findall(sentence.norm)]
    for i, token in enumerate(tokens):
        bare = token.strip("'-")
        if not bare or bare.lower() in _NAMED or bare.lower() in STOP_WORDS or not bare[0].isalpha():
            continue
        if (i > 0 and bare[0].isupper()) or _CALENDAR.match(bare):
            concrete.append(bare.lower())
    numbers = {c for c in concrete if c[0].isdigit()}
    return (*words, *(f"#{c}" for c in concrete)), len(set(words)) + len(numbers)


# Both are asked about the same few messages once per suggestion that precedes them.
@lru_cache(maxsize=512)
def _proposes(text: str) -> bool:
    return bool(_SUGGESTION.search(_normalise(text)))


@lru_cache(maxsize=512)
def _reaction(text: str) -> str | None:
    """'agreed', 'disagreed' or None for a reply; the earliest cue wins ("Good idea, but…")."""
    text = _normalise(text)
    found = [(m.start(), verdict) for pattern, verdict in ((_DISAGREE, "disagreed"), (_AGREE, "agreed"))
             if (m := pattern.search(text))]
    return min(found)[1] if found else None


# --- the extractor -------------------------------------------------------------------


class RuleBasedExtractor:
    """Extracts an episode, directives, facts and suggestions from a window by rule. Deterministic."""

    name = "rules"

    async def extract(self, window: Window) -> Extraction:
        sentences = self._sentences(window)
        return Extraction(episode=self._episode(sentences), items=self._items(window, sentences))

    @staticmethod
    def _sentences(window: Window) -> list[_Sentence]:
        out = []
        for position, message in enumerate(window.messages):
            if message.role not in (Role.USER, Role.ASSISTANT):
                continue
            for index, text in enumerate(split_sentences(message.content)):
                out.append(
                    _Sentence(
                        message=message,
                        order=(position, index),
                        speaker=_speaker(message),
                        text=text,
                        norm=_normalise(text),
                        stems=tuple(content_words(text)),
                    )
                )
        return out

    # episode

    @staticmethod
    def _episode(sentences: list[_Sentence]) -> str | None:
        """SumBasic-style extractive summary within the episode word limit.

        A sentence scores the summed window frequency of its distinct content words over
        the square root of its length (user sentences weighted up). Chat formulas ("thanks",
        "take care", "always a pleasure") do not count; names, numbers and dates count as
        if said at least twice. After a pick, the frequencies of its words are squared, so
        the next pick favours what is not yet said. Chosen sentences keep window order.
        """
        limit = WORD_LIMITS[MemoryKind.EPISODE]
        described = {id(s): _episode_units(s) for s in sentences}
        if not any(units for units, _ in described.values()):  # all small talk: say so rather than nothing
            described = {id(s): (s.stems, len(set(s.stems))) for s in sentences}
        units = {k: v[0] for k, v in described.items()}
        candidates, seen = [], set()
        for sentence in sentences:
            if units[id(sentence)] and _key(sentence.text) not in seen:
                seen.add(_key(sentence.text))
                candidates.append(sentence)
        if not candidates:
            return None
        # "Perfect." or "Sounds good, I agree." mean nothing out of context: prefer
        # sentences with at least two content words whenever there are any.
        substantial = [s for s in candidates if described[id(s)][1] >= 2]
        candidates = substantial or candidates
        counts = Counter(w for s in candidates for w in units[id(s)])
        for w in counts:
            if w.startswith("#"):  # names, numbers and dates are what later questions ask for
                counts[w] = max(counts[w], CONCRETE_MIN_COUNT)
        total = sum(counts.values())
        weight = {w: c / total for w, c in counts.items()}

        def score(s: _Sentence) -> float:
            # Total weight of what the sentence says, damped by its length: long sentences
            # say more but spend more of the word budget.
            value = sum(weight[w] for w in set(units[id(s)])) / math.sqrt(_word_count(s.text))
            return value * (USER_WEIGHT if s.is_user else 1.0)

        def cost(s: _Sentence) -> int:  # an upper bound: the prefix is dropped between same-speaker sentences
            return _word_count(s.text) + _word_count(s.speaker + ":")

        def rank(s: _Sentence) -> tuple[float, tuple[int, int]]:
            # Ties go to the earlier sentence, so the same window always gives the same text.
            return -score(s), s.order

        chosen: list[_Sentence] = []
        used = 0
        remaining = [s for s in candidates if cost(s) <= limit]
        while remaining:
            best = min(remaining, key=rank)
            chosen.append(best)
            used += cost(best)
            for w in set(units[id(best)]):
                weight[w] **= 2
            remaining = [s for s in remaining if s is not best and cost(s) <= limit - used]
        if not chosen:  # every sentence is longer than the limit: keep the best one, cut
            chosen = [min(candidates, key=rank)]
        return limit_words(_render(sorted(chosen, key=lambda s: s.order)), limit)

    # directives, facts, suggestions

    @staticmethod
    def _items(window: Window, sentences: list[_Sentence]) -> list[ExtractedItem]:
        """Directives, the users' facts, and the shards' facts and suggestions (docs/extraction.md,
        "Formation that keeps meaning"): pleasantries, questions and sentences that refer
        back to another turn yield nothing; facts and suggestions are phrased as facts."""
        shards = [s for s in window.shards if s.active]
        topics = {s.shard_id: _shard_words(s) for s in shards}
        items: list[ExtractedItem] = []
        user_index: dict[tuple[str, str], int] = {}  # (user, key) -> index of a directive or user fact
        seen_on_shard: set[tuple[str, str]] = set()
        speakers = sorted({m.user_id for m in window.messages if m.role == Role.USER and m.user_id})

        def keep_for_user(kind: MemoryKind, user: str, content: str, message_id: str) -> None:
            said = (user, _key(content))
            if said in user_index:  # said twice: one memory, both messages as its source
                i = user_index[said]
                items[i] = _with_source(items[i], message_id)
                return
            user_index[said] = len(items)
            items.append(ExtractedItem(kind=kind, content=limit_words(content, WORD_LIMITS[kind]),
                                       message_ids=(message_id,), user_id=user))

        for sentence in sentences:
            if is_pleasantry(sentence.text):
                continue
            user = sentence.message.user_id if sentence.is_user else None
            statement = statement_kind(sentence.text) if user else None
            if user and statement == DIRECTIVE:
                keep_for_user(MemoryKind.DIRECTIVE, user, sentence.text, sentence.message.message_id)
                continue
            if user and statement == ABOUT_USER:
                # About the user, not how to act: a fact about them, in their namespace only.
                if about := third_person(sentence.text, user):
                    keep_for_user(MemoryKind.FACT, user, about, sentence.message.message_id)
                continue
            suggestion = bool(_SUGGESTION.search(sentence.norm))
            fact = not (suggestion or sentence.is_question or refers_back(sentence.text) or _imperative(sentence.norm)) and (
                sentence.is_user or not _ASSISTANT_SMALL_TALK.match(sentence.norm)
            )
            if not (suggestion or fact):
                continue
            stems = set(sentence.stems)
            key = _key(sentence.text)
            matching = [
                shard.shard_id
                for shard in shards
                if stems & topics[shard.shard_id] and (shard.shard_id, key) not in seen_on_shard
            ]
            if not matching:
                continue
            if is_personal(sentence.text, names=speakers, assistant=not sentence.is_user):
                # About a person, not the topic: a shard is shared by every user of the
                # agent, so it is kept for the person alone (memory_service.formation.personal),
                # said of them in the third person.
                owner = user if sentence.is_user else _addressee(window)
                personal = _personal_fact(sentence, owner, suggestion) if owner else None
                if owner and personal:
                    keep_for_user(MemoryKind.FACT, owner, personal, sentence.message.message_id)
                continue
            if suggestion:
                proposed = _suggestion(window, sentence)
                if proposed is None:
                    continue
                kind = MemoryKind.SUGGESTION
                content, message_ids = proposed
            else:
                kind = MemoryKind.FACT
                content = limit_words(_topic_fact(sentence.text), WORD_LIMITS[kind])
                if _word_count(content) < 3:  # "Booked.", "Done, all set": no subject, nothing stated
                    continue
                message_ids = (sentence.message.message_id,)
                # Topic knowledge is kept once, in the shard it is most about (ties: each of them).
                overlap = {shard_id: len(stems & topics[shard_id]) for shard_id in matching}
                matching = [shard_id for shard_id in matching if overlap[shard_id] == max(overlap.values())]
            for shard_id in matching:
                seen_on_shard.add((shard_id, key))
                items.append(
                    ExtractedItem(
                        kind=kind,
                        content=content,
                        message_ids=message_ids,
                        user_id=user,
                        shard_id=shard_id,
                    )
                )
        return items


def _personal_fact(sentence: _Sentence, owner: str, suggestion: bool) -> str | None:
    """A personal sentence as a fact about ``owner``: a proposal as what its speaker suggested
    ("bob suggested dinner at Ao 26, since Alice is vegetarian"), else in the third person."""
    if not suggestion:
        return third_person(sentence.text, owner, assistant=not sentence.is_user)
    proposed = proposal_as_fact(sentence.text, sentence.speaker)
    if proposed and _FIRST_PERSON_LEFT.search(proposed):
        proposed = third_person(proposed, owner) if sentence.is_user else None
    return proposed and proposed.rstrip(".?!") + "."


_FIRST_PERSON_LEFT = re.compile(r"\b(?:i|i'm|i've|i'd|i'll|me|my|mine|myself|we|our|ours)\b", re.IGNORECASE)


# A sentence that opens with a bare verb asks for something ("Book the 9am train for me");
# it states nothing, so it is no fact.
_IMPERATIVE_VERBS = _SERVICE | _MANNER | _NAMING | frozenset(
    "find get help let look take go come see bring buy pay pick remember do don't".split()
)


def _imperative(text: str) -> bool:
    first = re.match(r"\W*(?:please\s+|just\s+)*([a-z]+(?:'[a-z]+)?)(?![\w-])", text, re.IGNORECASE)
    return first is not None and first.group(1).lower() in _IMPERATIVE_VERBS


def _topic_fact(text: str) -> str:
    """A shard fact as topic knowledge, not as someone's line: no speaker prefix, no leading
    filler ("Oh, yeah, the museum is shut on Mondays." -> "The museum is shut on Mondays.").
    Who said it stays in the memory's provenance (its source messages and user)."""
    body = text[_filler_end(text, 0):].strip() or text.strip()
    return body[0].upper() + body[1:]


def _addressee(window: Window) -> str | None:
    """Whom the assistant's "you" means: the one user of the window (with two or more, a
    guess: None, and the personal sentence is not kept)."""
    users = {m.user_id for m in window.messages if m.role == Role.USER and m.user_id}
    return users.pop() if len(users) == 1 else None


def _suggestion(window: Window, sentence: _Sentence) -> tuple[str, tuple[str, ...]] | None:
    """'bob suggested that the group take the night train (alice agreed; carol disagreed)' and
    its source message ids; None when nothing is proposed ("Let's do it!")."""
    limit = WORD_LIMITS[MemoryKind.SUGGESTION]
    agreed, disagreed, reaction_ids = _reactions(window, sentence)
    notes = [f"{', '.join(agreed)} agreed"] if agreed else []
    if disagreed:
        notes.append(f"{', '.join(disagreed)} disagreed")
    note = f" ({'; '.join(notes)})" if notes else ""
    body = proposal_as_fact(sentence.text, sentence.speaker)
    if body is None:
        return None
    # Cut the rationale, not the verdicts: who agreed is what makes a suggestion useful.
    room = max(limit - _word_count(note), 8)
    return limit_words(f"{limit_words(body, room)}{note}.", limit), (sentence.message.message_id, *reaction_ids)


def _render(chosen: list[_Sentence]) -> str:
    """'alice: A. B. assistant: C.' — one prefix per run of sentences by the same speaker."""
    parts, last = [], None
    for sentence in chosen:
        parts.append(sentence.text if sentence.speaker == last else f"{sentence.speaker}: {sentence.text}")
        last = sentence.speaker
    return " ".join(parts)


def _shard_words(shard: Shard) -> set[str]:
    return set(content_words(f"{shard.name} {shard.extraction_focus}"))


def _with_source(item: ExtractedItem, message_id: str) -> ExtractedItem:
    if message_id in item.message_ids:
        return item
    return ExtractedItem(item.kind, item.content, (*item.message_ids, message_id), item.user_id, item.shard_id)


def _reactions(window: Window, sentence: _Sentence) -> tuple[list[str], list[str], list[str]]:
    """Who agreed and who disagreed with a suggestion, and the ids of their replies.

    Only other users count (the assistant's assent is not a vote), each once, with their
    first reply. The scan stops after a message that makes a new proposal, because later
    replies answer that one.
    """
    agreed: list[str] = []
    disagreed: list[str] = []
    ids: list[str] = []
    voted = {sentence.speaker}
    start = sentence.order[0] + 1
    for message in window.messages[start : start + REACTION_LOOKAHEAD]:
        if message.role == Role.USER and _speaker(message) not in voted:
            verdict = _reaction(message.content)
            if verdict:
                voted.add(_speaker(message))
                (agreed if verdict == "agreed" else disagreed).append(_speaker(message))
                ids.append(message.message_id)
        if _proposes(message.content):
            break
    return agreed, disagreed, ids
