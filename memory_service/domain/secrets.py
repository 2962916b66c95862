"""Secrets and personal data in text: where they are, and the text with them redacted.

Why: whatever a user pastes into a chat (an API key, a password, a card number) would
otherwise be stored, embedded, indexed, sent to the extraction LLM and kept until the
retention job purges it. The record paths call ``redact`` (through the agent's policy,
memory_service/domain/redaction.py) before anything is stored, embedded, logged or audited,
and error messages quote input through it (``errors.preview``), so a value found here never
leaves the request that brought it (docs/redaction.md).

What is found, by kind (``Kind``): provider API keys in their own formats (OpenAI,
Anthropic, AWS, GitHub, GitLab, Slack, Stripe, Google, npm, Hugging Face, SendGrid...) and
keys named as such ("api_key=..."); tokens (JWTs, bearer and basic credentials, values
named tokens); PEM private key blocks; passwords stated in text ("my password is ...",
"pw: ...", a PIN, a URL's user:password@); card numbers (13 to 19 digits with a valid Luhn
checksum and a known issuer prefix); IBANs (the country's length and the mod-97 check);
government ids that can be checked (US social security numbers outside the ranges never
issued, UK national insurance numbers outside the prefixes never used); and, as personal
data a policy may add, email addresses and phone numbers.

Pure and cheap, because the single-message route is a hot path: one combined pattern of
every detector's cue (``_CUES``) is searched first, and a text without any cue (most chat
messages) is answered at once; only a text with a cue runs the detectors. Every value a
detector takes is checked (checksums, issuer ranges, letters and digits mixed, stop words)
so that look-alikes stay: order numbers, git hashes and UUIDs in code, prices, versions.

Redacting is idempotent: a marker (``[redacted:<kind>]``) is found by no detector, so
redacting a redacted text changes nothing. No detector's value crosses a quote or a
backslash, so redacting the JSON of a write block leaves valid JSON.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum


class Kind(StrEnum):
    API_KEY = "api_key"
    TOKEN = "token"
    PRIVATE_KEY = "private_key"
    PASSWORD = "password"
    CARD_NUMBER = "card_number"
    IBAN = "iban"
    GOVERNMENT_ID = "government_id"
    EMAIL = "email"
    PHONE = "phone"


# Found and redacted unless a policy leaves them out: secrets. Personal data (emails and
# phone numbers) only when a policy asks for them.
SECRET_KINDS: tuple[Kind, ...] = (Kind.API_KEY, Kind.TOKEN, Kind.PRIVATE_KEY, Kind.PASSWORD, Kind.CARD_NUMBER,
                                  Kind.IBAN, Kind.GOVERNMENT_ID)
PERSONAL_KINDS: tuple[Kind, ...] = (Kind.EMAIL, Kind.PHONE)
ALL_KINDS: tuple[Kind, ...] = (*SECRET_KINDS, *PERSONAL_KINDS)
_RANK = {kind: n for n, kind in enumerate(ALL_KINDS)}  # a tie between two findings: the earlier kind


def marker(kind: Kind) -> str:
    """What a redacted value is replaced with."""
    return f"[redacted:{kind.value}]"


MARKER_PREFIX = "[redacted:"


@dataclass(frozen=True, slots=True)
class Finding:
    kind: Kind
    start: int
    end: int


Span = tuple[int, int]


@dataclass(frozen=True, slots=True)
class _Detector:
    kind: Kind
    # What every text it finds something in holds: one of these words (in lower case), or
    # six digits in pairs (``DIGITS_CUE``); the prefilter is their union.
    cue: tuple[str, ...]
    pattern: re.Pattern[str]
    accept: Callable[[re.Match[str], str], Span | None]


Accept = Callable[[re.Match[str], str], Span | None]

# Every pattern starts with a literal or a character class, and looks behind only after it:
# Python's engine then skips to the places that may match (a pattern that starts by looking
# behind is tried at every character, five times slower). A value's run of characters is
# possessive (``{m,n}+``) where what follows it may not continue it: a run that is too long
# fails at once, not after giving back each of its characters (a hostile text of
# "token=token=..." would otherwise cost O(length x 250)). A pattern that starts with a
# word of varying length checks what comes before it in its ``accept`` (``_word_start``).

# Six digits, in pairs at most one separator apart: in every card number, IBAN (its account
# number), social security, insurance and phone number the detectors take (``_digits``).
DIGITS = re.compile(r"\d\d[ .()/-]?\d\d[ .()/-]?\d\d")
DIGITS_CUE = ("<digits>",)


def _digits(accept: Accept) -> Accept:
    """``accept``, for a value that holds the digits cue only: so the prefilter misses none."""
    def checked(match: re.Match[str], text: str) -> Span | None:
        span = accept(match, text)
        return span if span is not None and DIGITS.search(text, span[0], span[1]) else None
    return checked


def _word_start(accept: Accept) -> Accept:
    """``accept``, for a match that starts a word (no letter or digit before it)."""
    def checked(match: re.Match[str], text: str) -> Span | None:
        start = match.start()
        return accept(match, text) if start == 0 or not text[start - 1].isalnum() else None
    return checked


def _whole(match: re.Match[str], text: str) -> Span | None:
    return match.span()


def _mixed(value: str) -> bool:
    """Letters and digits both: what a random key holds and a word or a number does not."""
    return any(c.isdigit() for c in value) and any(c.isalpha() for c in value)


def _mixed_whole(match: re.Match[str], text: str) -> Span | None:
    return match.span() if _mixed(match.group()) else None


def _mixed_value(match: re.Match[str], text: str) -> Span | None:
    value = match.group("v")
    return match.span("v") if _mixed(value) and not value.startswith(MARKER_PREFIX) else None


# API keys -----------------------------------------------------------------------------------

_KEY_TAIL = r"(?![A-Za-z0-9_-])"
_PROVIDER_KEYS: list[tuple[tuple[str, ...], str, Accept]] = [
    # OpenAI (sk-, sk-proj-, sk-svcacct-, sk-admin-) and Anthropic (sk-ant-api03-...)
    (("sk-",), r"sk-(?<![A-Za-z0-9_-]sk-)[A-Za-z0-9_-]{20,250}+" + _KEY_TAIL, _mixed_whole),
    # Stripe secret and restricted keys, webhook secrets
    (("_live_", "_test_"), r"[sr]k_(?<![A-Za-z0-9]...)(?:live|test)_[A-Za-z0-9]{16,250}+(?![A-Za-z0-9])", _whole),
    (("whsec_",), r"whsec_(?<![A-Za-z0-9]whsec_)[A-Za-z0-9+/=]{24,250}+(?![A-Za-z0-9])", _whole),
    # AWS access key ids
    (("akia", "asia", "abia", "acca"), r"A(?:KIA|SIA|BIA|CCA)(?<![A-Za-z0-9]....)[A-Z2-7]{16}(?![A-Za-z0-9])", _whole),
    # GitHub tokens (personal, OAuth, user-to-server, server-to-server, refresh; fine-grained)
    (("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
     r"g(?:h[pousr]_(?<![A-Za-z0-9_]....)[A-Za-z0-9]{36,251}+|ithub_pat_(?<![A-Za-z0-9_]github_pat_)[A-Za-z0-9_]{22,255}+)"
     r"(?![A-Za-z0-9_])", _whole),
    (("glpat-",), r"glpat-(?<![A-Za-z0-9]glpat-)[A-Za-z0-9_-]{20,250}+" + _KEY_TAIL, _whole),
    # Slack tokens and incoming webhooks
    (("xox",), r"xox[abposr]-(?<![A-Za-z0-9].....)[A-Za-z0-9-]{10,250}+(?![A-Za-z0-9-])", _mixed_whole),
    (("hooks.slack.com",), r"https://hooks\.slack\.com/services/[A-Za-z0-9/_-]{20,200}", _whole),
    # Google API keys
    (("aiza",), r"AIza(?<![A-Za-z0-9_-]AIza)[0-9A-Za-z_-]{35}" + _KEY_TAIL, _whole),
    # npm, Hugging Face, SendGrid, DigitalOcean, Shopify
    (("npm_",), r"npm_(?<![A-Za-z0-9_]npm_)[A-Za-z0-9]{36}(?![A-Za-z0-9])", _whole),
    (("hf_",), r"hf_(?<![A-Za-z0-9_]hf_)[A-Za-z]{34,40}(?![A-Za-z0-9])", _whole),
    (("sg.",), r"SG\.(?<![A-Za-z0-9]SG\.)[A-Za-z0-9_-]{22}\.[A-Za-z0-9_-]{43}" + _KEY_TAIL, _whole),
    (("_v1_",), r"do[pro]_v1_(?<![A-Za-z0-9].......)[a-f0-9]{64}(?![A-Za-z0-9])", _whole),
    (("shp",), r"shp(?:at|ca|pa|ss)_(?<![A-Za-z0-9]......)[a-fA-F0-9]{32}(?![A-Za-z0-9])", _whole),
]

# An AWS secret access key (40 characters of base64) is told from other strings by what is
# near it: an access key id, or words that name it.
_AWS_NEAR = re.compile(r"A(?:KIA|SIA)[A-Z2-7]{16}|(?i:aws|secret[ _-]?access)")
_AWS_SECRET = re.compile(r"(?<![A-Za-z0-9/+])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])")
AWS_NEAR_CHARS = 200


def _aws_secret(match: re.Match[str], text: str) -> Span | None:
    value = match.group()
    if not (any(c.isupper() for c in value) and any(c.islower() for c in value) and any(c.isdigit() for c in value)):
        return None  # hex digests (lower case) and words are not keys
    near = text[max(0, match.start() - AWS_NEAR_CHARS):match.end() + AWS_NEAR_CHARS]
    return match.span() if _AWS_NEAR.search(near) else None


# A value named as a key, a secret or a token: letters and digits mixed, 16 characters or more
# (quoted or not; a JSON string's escaped quote too).
_NAMED_VALUE = r"""(?:\s+(?:is|was|=|:)|\s*[:=])\s*(?:\\?["'`])?(?P<v>[A-Za-z0-9_\-./+=~]{16,250}+)(?![A-Za-z0-9_\-./+=~])"""
# Found at "key", "secret" or "token" (a pattern that starts with a list of words is tried at
# every letter they start with: five times slower); the words before it are checked after.
_NAMED_KEY = r"(?i)(?:key|secret)(?:[ _-]?id)?" + _NAMED_VALUE
_NAMED_TOKEN = r"(?i)token" + _NAMED_VALUE
_KEY_NAMES = re.compile(r"(?i)(?:^|[^a-z0-9])(?:api|secret|access|private|client|app|license|licence)[ _-]?$")
_SECRET_NAMES = re.compile(r"(?i)(?:^|[^a-z0-9])(?:(?:client|app)[ _-]?)?$")
_TOKEN_NAMES = re.compile(r"(?i)(?:^|[^a-z0-9])(?:(?:access|auth|refresh|session|api|bot|bearer|oauth|"
                          r"personal[ _-]access|id)[ _-]?)?$")
NAME_CHARS = 24  # how far before the word its qualifier is looked for


def _named(match: re.Match[str], text: str) -> Span | None:
    """A value named "api key", "access key id", "secret", "client secret", "auth token",
    "token"...: not "monkey", "primary key" or "tokens"."""
    start = match.start()
    word = match.group()[:3].lower()
    names = _KEY_NAMES if word == "key" else _SECRET_NAMES if word == "sec" else _TOKEN_NAMES
    if not names.search(text, max(0, start - NAME_CHARS), start):
        return None
    return _mixed_value(match, text)


# Tokens -----------------------------------------------------------------------------------

_JWT = r"eyJ(?<![A-Za-z0-9_-]eyJ)[A-Za-z0-9_-]{8,}+\.eyJ[A-Za-z0-9_-]{8,}+\.[A-Za-z0-9_-]*+" + _KEY_TAIL
_AUTH_HEADER = (r"(?i)(?:bearer|authorization\s*:\s*(?:basic|token|bearer))\s+"
                r"(?P<v>[A-Za-z0-9\-._~+/]{12,}+=*+)(?![A-Za-z0-9\-._~+/=])")

# Private keys -------------------------------------------------------------------------------

_PEM_LABEL = r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----"
# The whole block (never across a quote: a JSON string ends there); else (cut short) the
# label and the base64 lines after it, a JSON string's escaped line breaks included.
_PEM = (_PEM_LABEL + r"(?:[^\"]{0,20000}?-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----"
        r"|(?:[A-Za-z0-9+/=:,\s-]|\\[nr])*)")

# Passwords ----------------------------------------------------------------------------------

# Words that follow "the password is" in sentences about a password, not in a password.
_NOT_PASSWORDS = frozenset("""
a an the my your his her our their its this that it same different wrong right incorrect correct invalid valid
expired expiring old new too not no none null empty blank required needed missing set reset changed change
strong weak secure insecure safe unsafe long short simple easy hard ok okay fine good bad case sensitive
case-sensitive being still now also very so in on at of for to from with by stored saved written hidden
encrypted hashed protected known unknown shared private secret there here what which who how why where when
something anything nothing everything mine yours ours theirs somewhere please probably definitely just only
already again below above attached sent enabled disabled locked unlocked asking asked typed entered working
broken forgotten lost
""".split())
_PLACEHOLDER = re.compile(r"^(?:[*•xX.·#?_-]+|\$\{?[A-Za-z_]+\}?|\{\{?[A-Za-z_ ]+\}?\}|%s|<[^>]*>|\.\.\.|…)$")
_PASSWORD = re.compile(
    r"(?i)(?P<kw>pass(?:word|wd|code|phrase)|pass[ _-]word|pwd|pw|pin(?:[ _-]?(?:code|number))?|"
    r"wi-?fi[ _-]?(?:key|code|password))"
    r"(?:[ _-]+(?:for|to|of|on)[ _-]+[^\n:=\"]{1,40}?)?"
    r"(?P<sep>\s+(?:is|was|is now|will be|would be|should be)\s*:?|\s*[:=]|'s|’s)\s*"
    r"(?:\\?\"(?P<q1>[^\"\\\n]{1,100})\\?\"|'(?P<q2>[^'\n]{1,100})'|“(?P<q3>[^”\n]{1,100})”|`(?P<q4>[^`\n]{1,100})`"
    r"|(?P<v>[^\s\"'<>\\`]{1,100}))")
_TRAILING = ".,;:!?)]}"


def _password(match: re.Match[str], text: str) -> Span | None:
    start = match.start()
    if start and text[start - 1].isalpha():
        return None  # "DB_PASSWORD=" is one, "bypassword" is not
    keyword = match.group("kw").lower()
    quoted = next((g for g in ("q1", "q2", "q3", "q4") if match.group(g) is not None), None)
    group = quoted or "v"
    begin, end = match.span(group)
    value = match.group(group)
    if not quoted:
        trimmed = value.rstrip(_TRAILING)
        end -= len(value) - len(trimmed)
        value = trimmed
        if value.lower() in _NOT_PASSWORDS:
            return None
    if value.startswith(MARKER_PREFIX) or _PLACEHOLDER.match(value.strip()):
        return None
    if keyword.startswith("pin"):
        return (begin, end) if value.isdigit() and 4 <= len(value) <= 12 else None
    if keyword in ("pw", "pwd") and match.group("sep").strip() not in (":", "="):
        return None  # "pw" said in a sentence is too often something else
    return (begin, end) if len(value) >= 3 else None


# user:password@ in a URL (the scheme before ://, checked by ``_url_password``)
_URL_CREDENTIALS = r"://[^\s:/@\"'\\]{1,128}:(?P<v>[^\s@/\"'\\]{1,256})@(?=[A-Za-z0-9\[])"
_SCHEME = re.compile(r"(?:^|[^A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]{1,20}$")


def _url_password(match: re.Match[str], text: str) -> Span | None:
    if match.group("v").startswith(MARKER_PREFIX) or not _SCHEME.search(text, max(0, match.start() - 22),
                                                                        match.start()):
        return None
    return match.span("v")


# Card numbers -------------------------------------------------------------------------------

_CARD = r"\d(?<![\d.,/-]\d)(?:[ -]?\d){12,18}(?![\d]|[.,/-]\d)"


def luhn_valid(digits: str) -> bool:
    total = 0
    for n, char in enumerate(reversed(digits)):
        d = ord(char) - 48
        if n % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _card_issuer(digits: str) -> bool:
    """Whether the number's length and prefix are a card issuer's (Visa, Mastercard, American
    Express, Discover, Diners Club, JCB, UnionPay, Maestro)."""
    n, p2, p3, p4 = len(digits), int(digits[:2]), int(digits[:3]), int(digits[:4])
    return ((digits[0] == "4" and n in (13, 16, 19))  # Visa
            or ((51 <= p2 <= 55 or 2221 <= p4 <= 2720) and n == 16)  # Mastercard
            or (p2 in (34, 37) and n == 15)  # American Express
            or ((p4 == 6011 or 644 <= p3 <= 649 or p2 == 65) and 16 <= n <= 19)  # Discover
            or ((300 <= p3 <= 305 or p2 in (36, 38, 39)) and 14 <= n <= 19)  # Diners Club
            or (3528 <= p4 <= 3589 and 16 <= n <= 19)  # JCB
            or (p2 == 62 and 16 <= n <= 19)  # UnionPay
            or ((p2 == 50 or 56 <= p2 <= 58 or p4 in (6304, 6759)) and 13 <= n <= 19))  # Maestro


def _card(match: re.Match[str], text: str) -> Span | None:
    value = match.group()
    groups = re.split(r"[ -]", value)
    if len(groups) > 1 and (len(set(re.findall(r"[ -]", value))) > 1 or any(len(g) < 3 for g in groups)):
        return None  # digits in groups of three or more, one separator: how cards are written
    digits = "".join(groups)
    if len(set(digits)) == 1 or not (_card_issuer(digits) and luhn_valid(digits)):
        return None
    return match.span()


# IBANs --------------------------------------------------------------------------------------

IBAN_LENGTHS = {
    "AD": 24, "AE": 23, "AL": 28, "AT": 20, "AZ": 28, "BA": 20, "BE": 16, "BG": 22, "BH": 22, "BR": 29, "BY": 28,
    "CH": 21, "CR": 22, "CY": 28, "CZ": 24, "DE": 22, "DK": 18, "DO": 28, "EE": 20, "EG": 29, "ES": 24, "FI": 18,
    "FO": 18, "FR": 27, "GB": 22, "GE": 22, "GI": 23, "GL": 18, "GR": 27, "GT": 28, "HR": 21, "HU": 28, "IE": 22,
    "IL": 23, "IQ": 23, "IS": 26, "IT": 27, "JO": 30, "KW": 30, "KZ": 20, "LB": 28, "LC": 32, "LI": 21, "LT": 20,
    "LU": 20, "LV": 21, "LY": 25, "MC": 27, "MD": 24, "ME": 22, "MK": 19, "MR": 27, "MT": 31, "MU": 30, "NL": 18,
    "NO": 15, "PK": 24, "PL": 28, "PS": 29, "PT": 25, "QA": 29, "RO": 24, "RS": 22, "SA": 24, "SC": 31, "SE": 24,
    "SI": 19, "SK": 24, "SM": 27, "ST": 25, "SV": 28, "TL": 23, "TN": 24, "TR": 26, "UA": 29, "VA": 22, "VG": 24,
    "XK": 20,
}
_IBAN = r"[A-Z](?<![A-Za-z0-9][A-Z])[A-Z]\d{2}(?:[ -]?[A-Za-z0-9]){10,32}"


def iban_valid(iban: str) -> bool:
    """The ISO 13616 check: the country's length, and the number mod 97 is 1."""
    iban = iban.upper()
    if IBAN_LENGTHS.get(iban[:2]) != len(iban) or not iban.isalnum():
        return False
    return int("".join(str(int(c, 36)) for c in iban[4:] + iban[:4])) % 97 == 1


def _iban(match: re.Match[str], text: str) -> Span | None:
    value = match.group()
    length = IBAN_LENGTHS.get(value[:2])
    if length is None:
        return None
    chars, end = 0, match.start()
    for offset, char in enumerate(value):  # the country's length of characters, separators skipped
        if char.isalnum():
            chars += 1
            if chars == length:
                end = match.start() + offset + 1
                break
    if chars < length or (end < len(text) and text[end].isalnum()):
        return None
    return (match.start(), end) if iban_valid(re.sub(r"[ -]", "", text[match.start():end])) else None


# Government ids -----------------------------------------------------------------------------

# US social security numbers: never 000, 666 or 9xx first, 00 middle, 0000 last.
_SSN = r"\d(?<![\d-]\d)\d\d(?P<s>[- ])\d\d(?P=s)\d{4}(?![\d-])"
_SSN_NAMED = (r"(?i)(?:ssn|social[ _-]security(?:[ _-](?:number|no\.?|#))?)\s*(?:is|:|#|=)?\s*"
              r"(?P<v>\d{9})(?!\d)")


def ssn_valid(digits: str) -> bool:
    area, group, serial = digits[:3], digits[3:5], digits[5:]
    return area not in ("000", "666") and area[0] != "9" and group != "00" and serial != "0000"


def _ssn(match: re.Match[str], text: str) -> Span | None:
    return match.span() if ssn_valid(re.sub(r"[- ]", "", match.group())) else None


def _ssn_named(match: re.Match[str], text: str) -> Span | None:
    return match.span("v") if ssn_valid(match.group("v")) else None


# UK national insurance numbers: two letters (not D, F, I, Q, U, V; not O second; not the
# prefixes BG, GB, NK, KN, TN, NT, ZZ), six digits, A to D.
_NINO = r"[A-CEGHJ-PR-TW-Z](?<![A-Za-z0-9][A-Z])[A-CEGHJ-NPR-TW-Z] ?\d{2} ?\d{2} ?\d{2} ?[A-D](?![A-Za-z0-9])"
_NINO_NEVER = frozenset({"BG", "GB", "NK", "KN", "TN", "NT", "ZZ"})


def _nino(match: re.Match[str], text: str) -> Span | None:
    return None if match.group()[:2] in _NINO_NEVER else match.span()


# Personal data ------------------------------------------------------------------------------

# An email address: found at its @, its local part read backwards from there.
_EMAIL = r"@[A-Za-z0-9-]{1,63}(?:\.[A-Za-z0-9-]{1,63})*\.[A-Za-z]{2,24}(?![A-Za-z0-9-])"
_LOCAL_PART = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._%+-")


def _email(match: re.Match[str], text: str) -> Span | None:
    start = match.start()
    while start > 0 and match.start() - start < 64 and text[start - 1] in _LOCAL_PART:
        start -= 1
    if start == match.start() or (start > 0 and text[start - 1] in _LOCAL_PART):
        return None
    return start, match.end()


_PHONE_INTERNATIONAL = r"\+(?<![\w+]\+)\d{1,3}(?:[ .-]?\(?\d{1,4}\)?){2,6}(?!\d)"
# North American numbers: (415) 555-0143, 415-555-0143, 1-415-555-0143 (the country code taken with it)
_PHONE_NANP = r"[(2-9](?:(?<=\()[2-9]\d{2}\)\s?|(?<!\()\d{2}[ .-])[2-9]\d{2}[ .-]\d{4}(?![\d-])"
_NANP_BEFORE = re.compile(r"(?:^|[^\w+-])\+?1[ .-]$")


def _nanp(match: re.Match[str], text: str) -> Span | None:
    start = match.start()
    if start == 0 or not (text[start - 1].isalnum() or text[start - 1] in "_+-"):
        return match.span()
    country = _NANP_BEFORE.search(text, max(0, start - 4), start)
    return (country.start() + (1 if text[country.start()] not in "+1" else 0), match.end()) if country else None

# national numbers with a trunk 0: written whole (10 or 11 digits), in pairs (06 12 34 56 78)
# or in three groups (020 7946 0321)
_PHONE_TRUNK = (r"0(?<![\w+.,/-]0)(?<!\d[ .-]0)(?:[1-9]\d{8,9}|[1-9](?:[ .-]\d{2}){4}|[1-9]\d{1,3}[ .-]\d{3,4}[ .-]\d{3,4})"
                r"(?![\d-]|[.,]\d)")
_PHONE_NAMED = (r"(?i)(?:phone|tel|mobile|cell|call me at|text me at|whatsapp)\b\D{0,15}?"
                r"(?P<v>\d[\d .-]{5,16}\d)(?![\d-])")


def _phone(low: int, high: int) -> Accept:
    def accept(match: re.Match[str], text: str) -> Span | None:
        group = "v" if "v" in match.re.groupindex else 0
        digits = sum(c.isdigit() for c in match.group(group))
        return match.span(group) if low <= digits <= high else None
    return accept


def _trunk_phone(match: re.Match[str], text: str) -> Span | None:
    value = match.group()
    separators = set(value) - set("0123456789")
    return match.span() if len(separators) <= 1 else None


# Every detector, with its cue ----------------------------------------------------------------


def _detectors() -> tuple[_Detector, ...]:
    found = [_Detector(Kind.API_KEY, cue, re.compile(pattern), accept) for cue, pattern, accept in _PROVIDER_KEYS]
    found += [
        _Detector(Kind.API_KEY, ("aws", "secret", "akia", "asia"), _AWS_SECRET, _aws_secret),
        _Detector(Kind.API_KEY, ("key", "secret"), re.compile(_NAMED_KEY), _named),
        _Detector(Kind.TOKEN, ("eyj",), re.compile(_JWT), _whole),
        _Detector(Kind.TOKEN, ("bearer", "authorization"), re.compile(_AUTH_HEADER), _word_start(_mixed_value)),
        _Detector(Kind.TOKEN, ("token",), re.compile(_NAMED_TOKEN), _named),
        _Detector(Kind.PRIVATE_KEY, ("-----begin ",), re.compile(_PEM), _whole),
        _Detector(Kind.PASSWORD, ("pass", "pw", "pin", "wifi", "wi-fi"), _PASSWORD, _password),
        _Detector(Kind.PASSWORD, ("://",), re.compile(_URL_CREDENTIALS), _url_password),
        _Detector(Kind.CARD_NUMBER, DIGITS_CUE, re.compile(_CARD), _digits(_card)),
        _Detector(Kind.IBAN, DIGITS_CUE, re.compile(_IBAN), _digits(_iban)),
        _Detector(Kind.GOVERNMENT_ID, DIGITS_CUE, re.compile(_SSN), _digits(_ssn)),
        _Detector(Kind.GOVERNMENT_ID, DIGITS_CUE, re.compile(_SSN_NAMED), _digits(_word_start(_ssn_named))),
        _Detector(Kind.GOVERNMENT_ID, DIGITS_CUE, re.compile(_NINO), _digits(_nino)),
        _Detector(Kind.EMAIL, ("@",), re.compile(_EMAIL), _email),
        _Detector(Kind.PHONE, DIGITS_CUE, re.compile(_PHONE_INTERNATIONAL), _digits(_phone(8, 15))),
        _Detector(Kind.PHONE, DIGITS_CUE, re.compile(_PHONE_NANP), _digits(_nanp)),
        _Detector(Kind.PHONE, DIGITS_CUE, re.compile(_PHONE_TRUNK), _digits(_trunk_phone)),
        _Detector(Kind.PHONE, DIGITS_CUE, re.compile(_PHONE_NAMED), _digits(_word_start(_phone(7, 15)))),
    ]
    return tuple(found)


def _words_pattern(words: Iterable[str]) -> re.Pattern[str]:
    """A pattern that finds each of ``words`` wherever it starts (overlaps included), the words
    grouped by their first character (Python's engine then tries one branch per character of
    the text, not one per word)."""
    by_first: dict[str, list[str]] = {}
    for word in sorted(set(words), key=len, reverse=True):
        by_first.setdefault(word[0], []).append(re.escape(word[1:]))
    branches = "|".join(re.escape(first) + (f"(?:{'|'.join(rests)})" if any(rests) else "")
                        for first, rests in sorted(by_first.items()))
    return re.compile(f"(?=({branches}))")


DETECTORS = _detectors()
_WORDS = _words_pattern(word for d in DETECTORS if d.cue is not DIGITS_CUE for word in d.cue)
_DIGITS_WORD = DIGITS_CUE[0]


def find(text: str, kinds: Collection[Kind] = ALL_KINDS, *, prefilter: bool = True) -> list[Finding]:
    """The values of ``kinds`` in ``text``, in order, none overlapping another (``_apart``).
    Only the detectors whose cue the text holds run: most texts hold none, and are answered
    after two searches. ``prefilter`` False runs every detector (to check that the cues miss
    nothing)."""
    if prefilter:
        cues = set(_WORDS.findall(text.lower()))
        if DIGITS.search(text) is not None:
            cues.add(_DIGITS_WORD)
        if not cues:
            return []
    found: list[Finding] = []
    for detector in DETECTORS:
        if detector.kind not in kinds or (prefilter and cues.isdisjoint(detector.cue)):
            continue
        for match in detector.pattern.finditer(text):
            span = detector.accept(match, text)
            if span is not None and span[1] > span[0]:
                found.append(Finding(detector.kind, *span))
    return _apart(found)


def _apart(found: Sequence[Finding]) -> list[Finding]:
    """The findings, none overlapping another. Secrets that overlap are redacted as one (so
    no part of either is left), named by the longer; personal data that overlaps a secret
    gives way to it (the password of ``user:password@host`` before the email its end looks
    like)."""
    secret = _merged([f for f in found if f.kind in SECRET_KINDS])
    personal = [p for p in _merged([f for f in found if f.kind not in SECRET_KINDS])
                if all(p.end <= s.start or p.start >= s.end for s in secret)]
    return sorted([*secret, *personal], key=lambda f: f.start)


def _merged(found: Sequence[Finding]) -> list[Finding]:
    groups: list[list[Finding]] = []
    for finding in sorted(found, key=lambda f: f.start):
        if groups and finding.start < max(f.end for f in groups[-1]):
            groups[-1].append(finding)
        else:
            groups.append([finding])
    return [Finding(max(group, key=lambda f: (f.end - f.start, -_RANK[f.kind])).kind, group[0].start,
                    max(f.end for f in group)) for group in groups]


@dataclass(frozen=True, slots=True)
class Redacted:
    """A text with its findings replaced by markers, and how many of each kind there were."""

    text: str
    counts: dict[str, int]

    @property
    def changed(self) -> bool:
        return bool(self.counts)


def redact(text: str, kinds: Collection[Kind] = SECRET_KINDS, findings: list[Finding] | None = None) -> Redacted:
    """``text`` with each value of ``kinds`` replaced by ``[redacted:<kind>]`` (``findings``:
    those ``find`` gave already)."""
    if findings is None:
        findings = find(text, kinds)
    if not findings:
        return Redacted(text, {})
    parts: list[str] = []
    at = 0
    counts: dict[str, int] = {}
    for finding in findings:
        parts += [text[at:finding.start], marker(finding.kind)]
        at = finding.end
        counts[finding.kind.value] = counts.get(finding.kind.value, 0) + 1
    parts.append(text[at:])
    return Redacted("".join(parts), {k.value: counts[k.value] for k in ALL_KINDS if k.value in counts})


def describe(counts: dict[str, int]) -> str:
    """``{"api_key": 2, "password": 1}`` as "2 api_key, 1 password": what an answer or a log
    says of what was found (kinds and counts, never a value)."""
    return ", ".join(f"{n} {kind}" for kind, n in counts.items())
