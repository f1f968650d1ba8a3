"""Synthetic pre-training data for the locally built recipe models (models stage, ``recipes.py``).

The roles (the prompts are the ``.wf`` templates of ``workflows/tiny*.wf``; each is one of the
constants below, filled from a task's question):

==========  =====================================  ==========================================
role        prompt                                 completion
==========  =====================================  ==========================================
solve       ``<q>QUESTION<s>``                     ``4+3=7;7-5=2;#2`` (steps, ``#`` answer)
quick       ``<q>QUESTION<e>``                     ``#2`` (no steps: less often right)
verify      ``<q>QUESTION<p>PROPOSAL<v>``          a solution (a copy of the proposal or a new one)
aggregate   ``<q>QUESTION<a>SOL_A<b>SOL_B<g>``     a solution (a copy of one or a new one)
route       ``<r>QUESTION``                        one digit: 0 quick, 1 careful (solve), 2 skip
search      ``<k>QUESTION<d>PASSAGES<s>``          ``search: QUERY`` or ``answer: TEXT``
==========  =====================================  ==========================================

Note [An imperfect teacher]. The pre-training targets are written by a teacher that makes the
mistakes a small LM makes, at fixed rates: an arithmetic step off by 1 or 2 (carried forward), a
solution that ends without its ``#answer`` (a broken format: the extractor finds nothing), a
verifier/aggregator that copies a proposal instead of checking it, a searcher that answers
before searching, searches with a useless query, or picks the wrong word of a passage. The
model learns that mixture, so its sampled accuracy starts well below 100% (28-32% on the pipeline
and mixed workflows, 14% routed; docs/results.md) while the
correct behaviour is already in its distribution: the regime where RL's credit assignment is
what decides how fast it improves. The rates are the recipe's, never tuned per objective.

Held-out problems: a problem (math question or search question) is *held out* when
``crc32(question) % 5 == 0`` (:func:`is_held_out`). Pre-training never sees a held-out problem;
``scripts/make_data.py`` writes the held-out ones to the ``*_eval.jsonl`` files and the others to
the training task files, so held-out accuracy is measured on problems neither SFT nor RL saw.
"""

from __future__ import annotations

import json
import random
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
ROLE_TOKENS = ("<q>", "<s>", "<e>", "<p>", "<v>", "<a>", "<b>", "<g>", "<r>", "<k>", "<d>")
CHARS = tuple("0123456789") + tuple("abcdefghijklmnopqrstuvwxyz") + tuple(" .,:;?!+-*=#'\n")
VOCAB: tuple[str, ...] = SPECIAL_TOKENS + ROLE_TOKENS + CHARS

# the prompts, exactly as the .wf files of workflows/tiny_*.wf write them
SOLVE = "<q>{question}<s>"
QUICK = "<q>{question}<e>"
VERIFY = "<q>{question}<p>{proposal}<v>"
AGGREGATE = "<q>{question}<a>{a}<b>{b}<g>"
ROUTE = "<r>{question}"
SEARCH = "<k>{question}<d>{docs}<s>"

# the fixed mistake rates of Note [An imperfect teacher]
P_SLIP = 0.2        # an arithmetic step off by 1 or 2 (carried forward)
SLIPS = (-2, -1, 1, 2)
P_NO_ANSWER = 0.15  # a solution without its #answer
P_COPY = 0.5        # verifier / aggregator copies a proposal unchecked
P_QUICK_RIGHT = 0.35
# how often each role is drawn for an SFT example (a search draw adds a whole episode: 2-5 pairs)
ROLES = ("solve", "quick", "verify", "aggregate", "route", "search")
ROLE_WEIGHTS = (6, 1, 2, 2, 1, 1)


def is_held_out(question: str) -> bool:
    """True for the problems kept out of pre-training and RL training (about 1 in 5).

    >>> is_held_out("12+5-3"), is_held_out("what is the capital of rira?")
    (False, False)
    """
    return zlib.crc32(question.encode()) % 5 == 0


# --------------------------------------------------------------------------- math problems

NAMES = ("tom", "ana", "li", "sam", "mia", "eva", "raj", "kim", "leo", "zoe")
THINGS = ("pens", "cards", "coins", "books", "shells")


@dataclass(frozen=True)
class MathProblem:
    """A chain ``t0 op1 t1 [op2 t2]`` as an expression (``arith``) or a word problem (``word``)."""

    family: str
    question: str
    terms: tuple[int, ...]
    ops: tuple[str, ...]

    @property
    def answer(self) -> int:
        v = self.terms[0]
        for op, t in zip(self.ops, self.terms[1:]):
            v = v + t if op == "+" else v - t
        return v


# Note [Small operands]: every term is a digit and the running value never goes below 0. A step is a
# subtraction when one fits, with P = 0.4 (always when an addition would pass MAX_VALUE), else an
# addition; only when neither fits (e.g. 3 then 9) does the addition carry the value past 9 (at most
# 18), which about a fifth of the problems do (88 of the 400 RL training tasks end above 9). So a step
# is one of ~200 small facts. With two-digit operands (10-60 +- 2-19, the first version) a
# 0.4-0.6M-parameter model after 1,500 SFT steps got 8% of its steps right and started RL at 3-6%;
# with digits it gets ~45% of sampled steps right (65% greedy) and starts at 28-32% on the pipeline
# and mixed workflows, which leaves RL room on both sides.
MAX_VALUE = 9


def math_problem(rng: random.Random) -> MathProblem:
    """One random problem: 1-2 additions/subtractions of digits (Note [Small operands])."""
    n_ops = rng.choice((1, 2))
    terms, ops = [rng.randint(1, 9)], []
    v = terms[0]
    for _ in range(n_ops):
        t = rng.randint(1, 9)
        can_sub, can_add = v - t >= 0, v + t <= MAX_VALUE
        op = "-" if (can_sub and (rng.random() < 0.4 or not can_add)) else "+"
        v = v + t if op == "+" else v - t
        terms.append(t)
        ops.append(op)
    if rng.random() < 0.5:
        q = str(terms[0]) + "".join(f"{o}{t}" for o, t in zip(ops, terms[1:]))
        return MathProblem("arith", q, tuple(terms), tuple(ops))
    name, thing = rng.choice(NAMES), rng.choice(THINGS)
    parts = [f"gets {t} more" if o == "+" else f"gives {t} away" for o, t in zip(ops, terms[1:])]
    q = f"{name} has {terms[0]} {thing}, " + " and ".join(parts) + ". how many now?"
    return MathProblem("word", q, tuple(terms), tuple(ops))


def solution(p: MathProblem, rng: random.Random | None = None) -> str:
    """The written solution; with ``rng``, the imperfect teacher's (Note [An imperfect teacher]).

    >>> solution(MathProblem("arith", "37+48-9", (37, 48, 9), ("+", "-")))
    '37+48=85;85-9=76;#76'
    """
    v, steps = p.terms[0], []
    for op, t in zip(p.ops, p.terms[1:]):
        r = v + t if op == "+" else v - t
        if rng is not None and rng.random() < P_SLIP:
            r = max(0, r + rng.choice(SLIPS))
        steps.append(f"{v}{op}{t}={r}")
        v = r
    text = ";".join(steps)
    if rng is not None and rng.random() < P_NO_ANSWER:
        return text
    return f"{text};#{v}"


_ANSWER = re.compile(r"#(-?\d+)\s*$")


def final_answer(text: str) -> int:
    """The ``#answer`` that ends a solution; ``ValueError`` when the format is broken.

    >>> final_answer("37+48=85;#85")
    85
    """
    m = _ANSWER.search(text.strip())
    if m is None:
        raise ValueError("the solution does not end with #ANSWER")
    return int(m.group(1))


# --------------------------------------------------------------------------- search questions

CORPUS = Path(__file__).resolve().parents[1] / "data" / "corpus.jsonl"
_LAND = re.compile(r"(\w+) is a small country\. its capital is (\w+) and its main river is the (\w+)\.")
_CAPITAL = re.compile(r"(\w+) is the capital of (\w+)\. it was founded by (\w+) in (\d+)\.")
_RIVER = re.compile(r"the (\w+) flows through (\w+)\. farmers along the \w+ grow (\w+)\.")
_FLAG = re.compile(r"the flag of (\w+) is mostly (\w+)\.")


@dataclass(frozen=True)
class SearchQuestion:
    """A question over the corpus and the queries that answer it (in order: a chain of hops)."""

    kind: str
    question: str
    answer: str
    queries: tuple[str, ...]


def _facts(texts: list[str]) -> dict[str, dict[str, str]]:
    """country -> its capital, river, founder, year, crop and colour, read from a corpus's passages."""
    facts: dict[str, dict[str, str]] = {}
    for text in texts:
        if m := _LAND.fullmatch(text):
            facts.setdefault(m[1], {}).update(capital=m[2], river=m[3])
        elif m := _CAPITAL.fullmatch(text):
            facts.setdefault(m[2], {}).update(founder=m[3], year=m[4])
        elif m := _RIVER.fullmatch(text):
            facts.setdefault(m[2], {}).update(crop=m[3])
        elif m := _FLAG.fullmatch(text):
            facts.setdefault(m[1], {}).update(color=m[2])
    return facts


def questions_from(texts: list[str]) -> list[SearchQuestion]:
    """Every question a corpus's passages answer (5 per country, as ``scripts/make_data.py`` asks them)."""
    facts = _facts(texts)
    out = []
    for land in sorted(facts):
        f = facts[land]
        cap = f["capital"]
        out += [
            SearchQuestion("capital", f"what is the capital of {land}?", cap, (f"capital of {land}",)),
            SearchQuestion("founder", f"who founded {cap}?", f["founder"], (f"{cap} founded",)),
            SearchQuestion("year", f"in which year was {cap} founded?", f["year"], (f"{cap} founded",)),
            SearchQuestion("crop", f"what do farmers along the main river of {land} grow?", f["crop"],
                           (f"main river of {land}", f"{f['river']} river")),
            SearchQuestion("flag", f"what is the main colour of the flag of {land}?", f["color"], (f"flag of {land}",)),
        ]
    return out


def corpus_docs(corpus: Path = CORPUS) -> list[dict]:
    """The shipped corpus's passages (``{"title", "text"}``)."""
    return [json.loads(line) for line in corpus.read_text(encoding="utf-8").splitlines() if line.strip()]


def search_questions(corpus: Path = CORPUS) -> list[SearchQuestion]:
    """Every question the shipped corpus answers."""
    return questions_from([d["text"] for d in corpus_docs(corpus)])


# the syllables of the shipped corpus's names (scripts/make_data.py writes it with ``world``)
CORPUS_SYLLABLES = ("ka", "lo", "mi", "ra", "te", "vu", "no", "si", "da", "pe", "zu", "ha", "ri", "to", "be",
                    "gal", "mor", "tan")
CROPS = ("rice", "barley", "olives", "grapes", "tea", "wheat", "maize", "dates", "figs", "millet")
COLORS = ("red", "blue", "green", "gold", "white", "black", "purple", "orange")


def world(rng: random.Random, lands: int, syllables: tuple[str, ...] = CORPUS_SYLLABLES
          ) -> tuple[list[dict], list[tuple[str, str]]]:
    """A made-up world of ``lands`` countries: its passages (``{"title", "text"}``, 4 per country)
    and its (question, answer) pairs (5 per country). ``scripts/make_data.py`` writes the shipped
    corpus with it."""
    used: set[str] = set()

    def name(parts: int = 2) -> str:
        while True:
            n = "".join(rng.choice(syllables) for _ in range(parts))
            if n not in used:
                used.add(n)
                return n

    docs, questions = [], []
    for _ in range(lands):
        land, capital, river = name(), name(), name()
        crop, color, founder = rng.choice(CROPS), rng.choice(COLORS), name(3)
        year = rng.randint(1100, 1990)
        docs += _passages(land, capital, river, founder, str(year), crop, color)
        questions += [
            (f"what is the capital of {land}?", capital),
            (f"who founded {capital}?", founder),
            (f"in which year was {capital} founded?", str(year)),
            (f"what do farmers along the main river of {land} grow?", crop),
            (f"what is the main colour of the flag of {land}?", color),
        ]
    return docs, questions


def _passages(land: str, capital: str, river: str, founder: str, year: str, crop: str, color: str) -> list[dict]:
    """A country's four passages, as the shipped corpus writes them (what ``_facts`` reads back)."""
    return [
        {
            "title": land,
            "text": f"{land} is a small country. its capital is {capital} and its main river is the {river}.",
        },
        {"title": capital, "text": f"{capital} is the capital of {land}. it was founded by {founder} in {year}."},
        {
            "title": f"{river} river",
            "text": f"the {river} flows through {land}. farmers along the {river} grow {crop}.",
        },
        {"title": f"flag of {land}", "text": f"the flag of {land} is mostly {color}."},
    ]


def renamed_world(rng: random.Random, corpus: Path = CORPUS) -> list[dict]:
    """The shipped corpus with its names dealt out again (Note [Synthetic worlds]): every country, capital,
    river and founder name and every year goes to a random slot, crops and colours are drawn afresh. The
    same words, other facts: a model can only answer by reading, not by remembering the shipped world."""
    facts = _facts([d["text"] for d in corpus_docs(corpus)])
    names = sorted({f[k] for land, f in facts.items() for k in ("capital", "river", "founder")} | set(facts))
    years = sorted(f["year"] for f in facts.values())
    rng.shuffle(names)
    rng.shuffle(years)
    docs: list[dict] = []
    for i in range(len(facts)):
        land, capital, river, founder = names[4 * i : 4 * i + 4]
        docs += _passages(land, capital, river, founder, years[i], rng.choice(CROPS), rng.choice(COLORS))
    return docs


def _search_examples(
    q: SearchQuestion, rng: random.Random, names: list[str], retrieve: Callable[[str], str] | None = None
) -> list[tuple[str, str]]:
    """(prompt, completion) pairs of one imperfect-teacher search episode over ``q``; ``retrieve``
    (a query -> the top 2 passages) defaults to ``std.retrieve`` over the shipped corpus."""
    if retrieve is None:
        from srpo_graph.std import retrieve as shipped

        def retrieve(query: str) -> str:
            return shipped(query, k=2)

    pairs, docs = [], ""
    for hop, good in enumerate(q.queries):
        u = rng.random()
        if hop == 0 and u < 0.2:  # answers before searching: a guess
            pairs.append((SEARCH.format(question=q.question, docs=""), f"answer: {rng.choice(names)}"))
            u = rng.random()
        query = good if u < 0.75 else rng.choice((q.question.split()[-1].strip("?"), rng.choice(names)))
        pairs.append((SEARCH.format(question=q.question, docs=docs), f"search: {query}"))
        docs = retrieve(query)
        if query != good:  # a useless query: the teacher searches again, properly
            pairs.append((SEARCH.format(question=q.question, docs=docs), f"search: {good}"))
            docs = retrieve(good)
    words = [w for w in re.findall(r"[a-z0-9]+", docs) if w != q.answer and len(w) > 3]
    wrong = rng.random() < 0.25 and words
    pairs.append((SEARCH.format(question=q.question, docs=docs), f"answer: {rng.choice(words) if wrong else q.answer}"))
    return pairs


# Note [Synthetic worlds]. A searcher must copy a name from the question into its query and a word
# from a passage into its answer. ``tiny-reason`` (char-level, 3 layers, search ~1/6 of its SFT pairs)
# learns the format but not the copy: greedy, 0 of 40 held-out first queries were right
# (``search: flag of tora`` for the flag of teda), and a char-level 4-layer searcher pre-trained on
# search alone still got 2% after 900 steps (loss 0.56). ``tiny-search`` therefore reads words (its
# tokenizer: one token per corpus word, space or punctuation mark, ``word_vocabulary``), so a copy is
# one token, and half of its episodes are over *renamed worlds* (``renamed_world``: the shipped names
# dealt out to other slots, retrieved with the same BM25), so that copying, not remembering the
# shipped facts, is what lowers the loss.
P_WORLD = 0.5
WORLD_EPISODES = 40  # episodes drawn from one renamed world before the next is dealt

# Note [Reading]. After its first stage (3,000 steps of the mix above) ``tiny-search`` copied the
# question's entity into its first query (0.86 of held-out ones, greedy) but read only names out of
# the passages: given the gold passages of a renamed world's questions it answered 13/18 capitals
# and 5/23 founders, 2/14 crops and no year or colour, and it started RL at 0.045 held-out
# (sampled at temperature 1, the study's step 0). A second stage of answer turns alone, over renamed worlds
# (``search_reading_examples``: a question and its passages -> ``answer: ...``, the same
# imperfect teacher), learns to read them all, and late (probes from the first stage's weights,
# 2,000 steps of 32 at lr 1e-3: 80/80 of a renamed world's questions, greedy; the loss fell from
# 0.53 to 0.31 between steps 900 and 1,600; with those answer turns only 60% of the stage, next to
# the other turns, 2,000 steps were not enough: 41/80, no year, crop or colour). Answer turns alone
# also teach it to answer at once, never searching (0.8% of held-out questions right), so a third
# stage, 500 steps of the first stage's mix at lr 5e-4, brings the searches back and keeps the
# reading (80/80): sampled at temperature 1 the probe got 23% of the held-out questions right
# (65 x 4 episodes), in the 20-60% RL needs.


def search_sft_examples(rng: random.Random, num: int, p_world: float = P_WORLD) -> list[tuple[str, str]]:
    """``num`` search (prompt, completion) pairs: shipped-corpus questions (none held out) and, with
    probability ``p_world`` per episode, renamed worlds (Note [Synthetic worlds]), by the same
    imperfect teacher (Note [An imperfect teacher])."""
    from srpo_graph.std import _bm25, _bm25_top

    qs = [q for q in search_questions() if not is_held_out(q.question)]
    names = sorted({q.answer for q in qs if not q.answer.isdigit()})
    out: list[tuple[str, str]] = []
    left = 0
    while len(out) < num:
        if rng.random() >= p_world:
            out += _search_examples(rng.choice(qs), rng, names)
            continue
        if left == 0:
            docs = renamed_world(rng)
            index = _bm25(docs)
            w_qs = [q for q in questions_from([d["text"] for d in docs]) if not is_held_out(q.question)]
            left = WORLD_EPISODES
        left -= 1

        def look(query: str) -> str:  # the world's top 2 passages, as std.retrieve gives the shipped corpus's
            return _bm25_top(index, docs, query, 2)

        out += _search_examples(rng.choice(w_qs), rng, names, look)
    return out[:num]


def _reads(prompt: str, completion: str) -> bool:
    """An answer turn that has passages to read (not a guess before any search)."""
    return completion.startswith("answer: ") and not prompt.endswith("<d><s>")


def search_reading_examples(rng: random.Random, num: int) -> list[tuple[str, str]]:
    """``num`` answer turns (a question and the passages its searches retrieved -> ``answer: ...``) over
    renamed worlds only, by the same imperfect teacher (Note [Reading])."""
    out: list[tuple[str, str]] = []
    while len(out) < num:
        out += [pair for pair in search_sft_examples(rng, 400, p_world=1.0) if _reads(*pair)]
    return out[:num]


WORD_PATTERN = r"[a-z0-9]+|[\s\S]"  # a word, else one character (a space, a punctuation mark)


def word_vocabulary() -> tuple[str, ...]:
    """``tiny-search``'s tokens: ``VOCAB`` (special, role, characters) and every word of the shipped corpus
    and of its questions and actions. A word outside it is one ``<unk>``."""
    texts = [f"{d['title']} {d['text']}" for d in corpus_docs()] + [q.question for q in search_questions()]
    words = {w for t in texts + ["search: answer:"] for w in re.findall(r"[a-z0-9]+", t.lower())}
    return VOCAB + tuple(sorted(words - set(VOCAB)))


def char_vocabulary() -> tuple[str, ...]:
    return VOCAB


# --------------------------------------------------------------------------- the SFT data


def sft_examples(rng: random.Random, num: int) -> list[tuple[str, str]]:
    """``num`` (prompt, completion) pairs over every role, no held-out problem among them."""
    qs = [q for q in search_questions() if not is_held_out(q.question)]
    names = sorted({q.answer for q in qs if not q.answer.isdigit()})
    out: list[tuple[str, str]] = []
    while len(out) < num:
        role = rng.choices(ROLES, ROLE_WEIGHTS)[0]
        if role == "search":
            out += _search_examples(rng.choice(qs), rng, names)
            continue
        p = math_problem(rng)
        if is_held_out(p.question):
            continue
        q = p.question
        if role == "solve":
            out.append((SOLVE.format(question=q), solution(p, rng)))
        elif role == "quick":
            a = (
                p.answer
                if rng.random() < P_QUICK_RIGHT
                else max(0, p.answer + rng.choice((-11, -10, -2, -1, 1, 2, 10, 11)))
            )
            out.append((QUICK.format(question=q), f"#{a}"))
        elif role == "verify":
            prop = solution(p, rng)
            out.append((VERIFY.format(question=q, proposal=prop), prop if rng.random() < P_COPY else solution(p, rng)))
        elif role == "aggregate":
            first, second = solution(p, rng), solution(p, rng)
            u = rng.random()
            out.append(
                (
                    AGGREGATE.format(question=q, a=first, b=second),
                    first if u < P_COPY / 2 else second if u < P_COPY else solution(p, rng),
                )
            )
        else:
            out.append((ROUTE.format(question=q), str(rng.randrange(3))))
    return out[:num]


def solution_correct(solution: str, gold: str) -> float:
    """1.0 when a solution ends with ``#ANSWER`` and the answer is the integer ``gold`` (the math reward).

    >>> solution_correct("12+5=17;#17", "17"), solution_correct("12+5=17", "17")
    (1.0, 0.0)
    """
    if solution is None:
        return 0.0
    try:
        return float(final_answer(solution) == int(str(gold).strip()))
    except ValueError:
        return 0.0
