"""Words to stems: the one stemmer that search (BM25) and offline formation share.

It lives in the vocabulary because both sides must agree: a memory formed with one stem
of "bookings" is found by a query stemmed the same way.
"""

from __future__ import annotations


def stem(word: str) -> str:
    """A deliberately small stemmer: enough that 'bookings', 'booked' and 'book' meet.

    Plural, then verb ending, then a final e/y/ic, each only when a stem of at least three
    letters remains, so short words are left alone.
    """
    w = word.lower()
    if w.endswith("'s"):
        w = w[:-2]
    if w.endswith("ies") and len(w) > 4:
        w = w[:-3] + "y"
    elif w.endswith(("sses", "ches", "shes", "xes", "zes")):
        w = w[:-2]
    elif w.endswith("s") and not w.endswith(("ss", "us", "is")) and len(w) > 3:
        w = w[:-1]
    for suffix in ("ing", "ed"):
        if w.endswith(suffix) and len(w) - len(suffix) >= 3:
            w = w[: -len(suffix)]
            if w[-1] == w[-2] and w[-1] not in "aeioulsz":  # planned -> plann -> plan
                w = w[:-1]
            break
    if w.endswith("ic") and len(w) >= 6:  # allergic / allergy -> allerg
        w = w[:-2]
    elif w.endswith(("e", "y")) and len(w) >= 4:  # date / dated -> dat
        w = w[:-1]
    return w
