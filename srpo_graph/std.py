"""``std``: the built-in extractors, rewards and tools a ``.wf`` file gets with ``import std``.

Every function here is an ordinary typed Python function; the checker reads its signature
(parameter count and annotations) to type-check calls, exactly as for a user's module.

* **Extractors** take the completion text first and return the typed value, raising
  ``ValueError`` when the text holds no such value (the output's value is then ``None``).
* **Rewards** return a float; they score a missing (``None``) value as 0.
* **Tools** return a value that joins the workflow state under the tool's name.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path

_INT = re.compile(r"[-+]?\d+")
_NUM = re.compile(r"[-+]?\d+(?:\.\d+)?(?:/\d+)?")

# --------------------------------------------------------------------------- extractors


def text(text: str) -> str:
    """The completion text, stripped.

    >>> text("  hi ")
    'hi'
    """
    return text.strip()


def first_int(text: str) -> int:
    """The first integer in the text.

    >>> first_int("x 12 y 3")
    12
    """
    m = _INT.search(text)
    if m is None:
        raise ValueError("no integer in the output")
    return int(m.group())


def last_int(text: str) -> int:
    """The last integer in the text.

    >>> last_int("x 12 y 3")
    3
    """
    found = _INT.findall(text)
    if not found:
        raise ValueError("no integer in the output")
    return int(found[-1])


def digit(text: str) -> int:
    """The first decimal digit in the text.

    >>> digit("7")
    7
    """
    for ch in text:
        if ch.isdigit():
            return int(ch)
    raise ValueError("no digit in the output")


def boxed(text: str) -> str:
    r"""The content of the last ``\boxed{...}`` (braces balanced), else the last number.

    >>> boxed(r"so \boxed{\frac{1}{2}} done")
    '\\frac{1}{2}'
    >>> boxed("the answer is 42")
    '42'
    """
    start = text.rfind("\\boxed{")
    if start >= 0:
        i, depth = start + len("\\boxed{"), 1
        for j in range(i, len(text)):
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            if depth == 0:
                return text[i:j].strip()
    nums = _NUM.findall(text)
    if nums:
        return nums[-1]
    raise ValueError("no \\boxed{} answer and no number in the output")


def choice(text: str, *options: str) -> str:
    """The option named first in the text (whole word), for ``choice[...]`` outputs.

    >>> choice("I pick beta, not alpha", "alpha", "beta")
    'beta'
    """
    best: tuple[int, str] | None = None
    for opt in options:
        m = re.search(rf"(?<![\w]){re.escape(opt)}(?![\w])", text)
        if m and (best is None or m.start() < best[0]):
            best = (m.start(), opt)
    if best is None:
        raise ValueError(f"none of {list(options)} in the output")
    return best[1]


def choices(text: str, *options: str) -> list[str]:
    """Every option named in the text, in declaration order, for ``choices[...]`` outputs.

    >>> choices("alpha and gamma", "alpha", "beta", "gamma")
    ['alpha', 'gamma']
    """
    picked = [o for o in options if re.search(rf"(?<![\w]){re.escape(o)}(?![\w])", text)]
    if not picked:
        raise ValueError(f"none of {list(options)} in the output")
    return picked


def digit_choice(text: str, *options: str) -> str:
    """A choice written as its index digit (``0`` = the first option): for tiny models.

    >>> digit_choice("1", "alpha", "beta")
    'beta'
    """
    d = digit(text)
    if d >= len(options):
        raise ValueError(f"choice index {d} out of range for {len(options)} options")
    return options[d]


def digit_choices(text: str, *options: str) -> list[str]:
    """A subset written as the options' index digits, 0-based (``02`` = the first and the third
    option; order and repeats do not matter, digits past the last option are ignored): for tiny
    models. Each digit is one token with an ``allow`` list of digits, so ``max_tokens`` bounds how
    many options one output can pick, and ``check`` proves the set sizes with that bound.

    >>> digit_choices("02", "a", "b", "c")
    ['a', 'c']
    >>> digit_choices("221", "a", "b", "c")
    ['b', 'c']
    """
    idx = sorted({int(c) for c in text if c.isdigit() and int(c) < len(options)})
    if not idx:
        raise ValueError("no option index in the output")
    return [options[i] for i in idx]


def json_record(text: str) -> dict:
    """The first JSON object in the text.

    >>> json_record('ok {"a": 1} done')
    {'a': 1}
    """
    start = text.find("{")
    while start >= 0:
        try:
            obj, _ = json.JSONDecoder().raw_decode(text[start:])
        except json.JSONDecodeError:
            start = text.find("{", start + 1)
            continue
        if isinstance(obj, dict):
            return obj
        start = text.find("{", start + 1)
    raise ValueError("no JSON object in the output")


def regex(text: str, pattern: str) -> str:
    """The first group (or whole match) of ``pattern``.

    >>> regex("answer: 12", r"answer: (\\d+)")
    '12'
    """
    m = re.search(pattern, text)
    if m is None:
        raise ValueError(f"pattern {pattern!r} does not match the output")
    return m.group(1) if m.groups() else m.group()


def search_action(text: str) -> dict:
    """``search: QUERY`` or ``answer: TEXT`` -> ``{"action": "search"|"answer", "query": str}``.

    Anything else counts as an answer (so a confused agent still ends its turn).

    >>> search_action("search: capital of peru")
    {'action': 'search', 'query': 'capital of peru'}
    """
    s = text.strip()
    low = s.lower()
    for action in ("search", "answer"):
        if low.startswith(action):
            return {"action": action, "query": s[len(action) :].lstrip(" :").strip()}
    return {"action": "answer", "query": s}


# --------------------------------------------------------------------------- rewards


def _norm(s: object) -> str:
    return " ".join(re.sub(r"[^\w\s.-]", " ", str(s).lower()).split())


def exact_match(pred: str, gold: str) -> float:
    """1.0 when the normalized strings agree.

    >>> exact_match(" Lima.", "lima")
    1.0
    """
    if pred is None:
        return 0.0
    return float(_norm(pred).strip(".") == _norm(gold).strip("."))


def _to_number(s: object) -> float | None:
    if isinstance(s, (int, float)):
        return float(s)
    m = _NUM.search(str(s).replace(",", ""))
    if m is None:
        return None
    v = m.group()
    if "/" in v:
        a, b = v.split("/")
        return float(a) / float(b) if float(b) else None
    return float(v)


def numeric_match(pred: str, gold: str, tol: float = 1e-6) -> float:
    """1.0 when both read as numbers within ``tol`` (fractions allowed).

    >>> numeric_match("1/2", "0.5")
    1.0
    """
    if pred is None:
        return 0.0
    a, b = _to_number(pred), _to_number(gold)
    return float(a is not None and b is not None and abs(a - b) <= tol)


def f1(pred: str, gold: str) -> float:
    """Token F1 between normalized strings (the usual QA metric).

    >>> round(f1("the city of lima", "lima"), 3)
    0.4
    """
    if pred is None:
        return 0.0
    p, g = _norm(pred).split(), _norm(gold).split()
    common = sum(min(p.count(w), g.count(w)) for w in set(p))
    if common == 0:
        return 0.0
    prec, rec = common / len(p), common / len(g)
    return 2 * prec * rec / (prec + rec)


def digits_sum_to(target: int, *digits: int) -> float:
    """1.0 when the digits sum to ``target`` modulo 10 (the coordination tasks).

    >>> digits_sum_to(3, 5, 8)
    1.0
    >>> digits_sum_to(3, 5, None)
    0.0
    """
    if any(d is None for d in digits):
        return 0.0
    return float(sum(digits) % 10 == target % 10)


def equals(a: int, b: int) -> float:
    """1.0 when two values are equal (``None`` never equals).

    >>> equals(3, 3)
    1.0
    """
    return float(a is not None and a == b)


def is_choice(picked: str, gold: str) -> float:
    """1.0 when a router picked the gold label.

    >>> is_choice("math", "math")
    1.0
    """
    return float(picked is not None and picked == gold)


# --------------------------------------------------------------------------- tools

DEFAULT_CORPUS = Path(__file__).parent / "data" / "corpus.jsonl"


@lru_cache(maxsize=8)
def _bm25_index(path: str):
    docs = [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    return _bm25(docs), docs


def retrieve(query: str, k: int = 2, corpus: str = "") -> str:
    """BM25 search over a JSONL corpus (``{"title", "text"}`` per line); the top ``k`` passages.

    ``corpus`` defaults to the small corpus shipped with srpo-graph
    (``scripts/make_data.py`` writes it).
    """
    if query is None or not str(query).strip():
        return ""
    index, docs = _bm25_index(str(Path(corpus) if corpus else DEFAULT_CORPUS))
    return _bm25_top(index, docs, str(query), k)


def _bm25(docs: list[dict]):
    """A BM25 index over ``{"title", "text"}`` passages, as :func:`retrieve` builds one (private: not a
    ``.wf`` function; ``models.recipes`` retrieves from its renamed worlds with it)."""
    from rank_bm25 import BM25Okapi

    return BM25Okapi([_norm(d["title"] + " " + d["text"]).split() for d in docs])


def _bm25_top(index, docs: list[dict], query: str, k: int) -> str:
    """The top ``k`` of ``docs`` for ``query``, one ``title: text`` line each (what :func:`retrieve` returns)."""
    scores = index.get_scores(_norm(query).split())
    top = sorted(range(len(docs)), key=lambda i: -scores[i])[:k]
    return "\n".join(f"{docs[i]['title']}: {docs[i]['text']}" for i in top)
