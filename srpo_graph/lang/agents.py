"""Check one agent declaration: policy, prompt template, sampling parameters, output and extractor.

Stage: lang (check). Consumes an :class:`~srpo_graph.lang.ast.AgentDecl` and the checker's
:class:`~srpo_graph.lang.scope.Scope`; produces an :class:`~srpo_graph.workflow.Agent` (built even
when it has errors, so the graph rules still run) and records its template references for the
path analysis. Problems go to the scope's diagnostics.
"""

from __future__ import annotations

from srpo_graph.errors import Span
from srpo_graph.lang import ast
from srpo_graph.lang.callables import return_annotation, returns_fit
from srpo_graph.lang.chat import chat_of, template_parts
from srpo_graph.lang.scope import ITEM_WORD, Scope, close_names, ret_str
from srpo_graph.workflow import (
    Agent,
    Call,
    ChoiceType,
    Literal_,
    Ref,
    Sampling,
    Template,
    TextPart,
    TextType,
    WfType,
    type_str,
)

# Extractor used when an output has no `via`: {type kind: std function}.
DEFAULT_EXTRACTORS = {"text": "text", "int": "last_int", "choice": "choice", "record": "json_record"}
# The sampling parameters a `sample { }` block accepts, and the Python type of each value.
SAMPLING_KEYS = {"temperature": float, "top_p": float, "top_k": int, "max_tokens": int, "stop": list, "allow": list}
# Range rules on the numeric parameters: {key: (predicate, what the message says, hint)}.
MAX_TOKENS = 1_000_000  # tokens per generation; more is surely a typo (and as rollout.max_tokens allows)
SAMPLING_RANGES = {
    "temperature": (
        lambda x: 0 < x <= 100,
        "must be in (0, 100]",
        "1.0 samples the model as trained; lower is more deterministic (eval is greedy already)",
    ),
    "top_p": (
        lambda x: 0 < x <= 1,
        "must be in (0, 1]",
        "1.0 = off; 0.9 keeps the smallest set of tokens with 90% mass",
    ),
    "top_k": (lambda x: 0 <= x <= 1_000_000, "must be in [0, 1000000] (0 = off)", "0 = off; e.g. 50"),
    "max_tokens": (
        lambda x: 1 <= x <= MAX_TOKENS,
        f"must be in [1, {MAX_TOKENS}]",
        "the most tokens one generation may have, e.g. 64 (1 for a single-token answer)",
    ),
}
# What each sampling parameter takes, for the hint of a type error.
SAMPLING_EXAMPLES = {
    "temperature": "temperature: 0.7",
    "top_p": "top_p: 0.9",
    "top_k": "top_k: 50",
    "max_tokens": "max_tokens: 64",
    "stop": 'stop: ["\\n"]',
    "allow": 'allow: ["0", "1"]',
}


def build_agent(scope: Scope, a: ast.AgentDecl) -> Agent:
    """The agent ``a`` declares (its output type is already in ``scope.agent_types``)."""
    name = a.name.value
    errors_before = len(scope.sink.errors)
    by_kind: dict[type, list] = {}
    for i in a.items:
        by_kind.setdefault(type(i), []).append(i)
    for kind, its in by_kind.items():
        for extra in its[1:]:
            scope.err(
                f"agent '{name}' sets `{ITEM_WORD[kind]}` twice",
                extra.span,
                f"keep one `{ITEM_WORD[kind]}` (the first is on line {its[0].span.line}) and delete this one",
                "duplicate-name",
            )
    pol = by_kind.get(ast.PolicyItem, [None])[0]
    prompt = by_kind.get(ast.PromptItem, [None])[0]
    if pol is None:
        scope.err(
            f"agent '{name}' has no policy",
            a.name.span,
            f"add `policy: NAME`; declared policies: {', '.join(scope.policies) or 'none'}",
            "missing-policy",
        )
    elif pol.policy.value not in scope.policies:
        scope.err(
            f"unknown policy '{pol.policy.value}'",
            pol.policy.span,
            close_names(pol.policy.value, scope.policies, 'declare it: policy NAME = "model"'),
            "unknown-policy",
        )
    if prompt is None:
        scope.err(f"agent '{name}' has no prompt", a.name.span, 'add `prompt: "..."`', "missing-prompt")
    refs: list[Ref] = []
    parts: list[TextPart | Ref] = template_parts(scope, prompt.template, refs) if prompt is not None else []
    chat = chat_of(scope, a, scope.policies.get(pol.policy.value) if pol else None, refs)
    scope.uses.agent_refs[name] = refs
    sampling = sampling_of(scope, by_kind.get(ast.SampleItem, [None])[0])
    out = by_kind.get(ast.OutputItem, [None])[0]
    out_type = scope.agent_types.get(name, TextType())
    extractor = extractor_of(scope, name, out, out_type)
    for u in by_kind.get(ast.UnconsumedItem, []):
        if u.value.value != "allow":
            scope.err(
                f"unknown value '{u.value.value}' for `unconsumed`",
                u.value.span,
                "the only value is `unconsumed: allow`",
                "bad-value",
            )
        else:
            scope.uses.unconsumed_ok.add(name)
    # an agent with errors is still built (its problems are reported) so the graph rules run; such
    # a draft (its extractor may be None) never becomes a Workflow: check() stops at the errors
    return scope.node(
        Agent,
        errors_before,
        node="agent",
        name=name,
        policy=pol.policy.value if pol else "",
        template=Template(parts=tuple(parts), span=prompt.template.span if prompt else None),
        sampling=sampling,
        output=out_type,
        span=a.span,
        extractor=extractor,
        chat=chat,
    )


def extractor_of(scope: Scope, agent: str, out: ast.OutputItem | None, t: WfType) -> Call | None:
    """The extractor of an output of type ``t``: its `via`, or the default for ``t`` (None: reported)."""
    options = tuple(Literal_(value=o) for o in t.options) if isinstance(t, ChoiceType) else ()
    if out is None or out.via is None:
        kind = "choice" if isinstance(t, ChoiceType) else t.kind
        fn_name = DEFAULT_EXTRACTORS.get(kind)
        if isinstance(t, ChoiceType) and t.multi:
            fn_name = "choices"
        if fn_name is None:
            scope.err(
                f"no default extractor for a {type_str(t)} output",
                out.type.span if out else None,
                "name one: `output: TYPE via module.function`",
                "missing-extractor",
            )
            return None
        return Call(
            module="srpo_graph.std", alias="std", function=fn_name, args=options, span=out.span if out else None
        )
    refs: list[Ref] = []
    for a in out.via.args:
        if isinstance(a.value, ast.Ref):
            scope.err(
                "an extractor's arguments must be literals",
                a.span,
                "the extractor sees only the completion text and these constants",
                "bad-call",
            )
    extra = options if (isinstance(t, ChoiceType) and not out.via.args) else ()
    call = scope.call(out.via, "extractor", refs, leading=(TextType(),), extra_args=extra)
    if call is None:  # reported by scope.call
        return None
    mod = scope.modules.get(out.via.module.value, (None, None, None))[1]
    fn = getattr(mod, out.via.function.value, None) if mod is not None else None
    if fn is not None and callable(fn) and not returns_fit(t, return_annotation(fn)):
        scope.err(
            f"extractor {call.qualname} returns {ret_str(fn)}, but the output is declared {type_str(t)}",
            out.via.span,
            "change the output type or use an extractor that returns it",
            "type-mismatch",
        )
    return call


def sampling_of(scope: Scope, s: ast.SampleItem | None) -> Sampling:
    """The sampling parameters of a `sample { }` block (bad entries are reported and left out)."""
    if s is None:
        return Sampling()
    values: dict = {}
    seen: dict[str, Span] = {}
    for e in s.entries:
        key = e.key.value
        if key not in SAMPLING_KEYS:
            scope.err(
                f"unknown sampling parameter '{key}'", e.key.span, close_names(key, SAMPLING_KEYS), "unknown-name"
            )
            continue
        if not scope.unique(e.key, seen, "sampling parameter"):
            continue
        want, v = SAMPLING_KEYS[key], e.value
        if want is list:
            items = v.items if isinstance(v, ast.ListLit) else (v,)
            if not all(isinstance(x, ast.StringLit) and x.value for x in items):
                scope.err(
                    f"`{key}` takes a list of non-empty strings",
                    e.value.span,
                    f"e.g. `{SAMPLING_EXAMPLES[key]}`",
                    "type-mismatch",
                )
                continue
            values[key] = tuple(x.value for x in items)
        elif not isinstance(v, ast.NumberLit) or (want is int and not isinstance(v.value, int)):
            scope.err(
                f"`{key}` takes {'an integer' if want is int else 'a number'}",
                e.value.span,
                f"e.g. `{SAMPLING_EXAMPLES[key]}`",
                "type-mismatch",
            )
        else:
            values[key] = want(v.value)
    for key, (ok, why, hint) in SAMPLING_RANGES.items():
        if key in values and not ok(values[key]):
            entry = next(e for e in s.entries if e.key.value == key)
            scope.err(f"`{key}` {why}", entry.value.span, hint, "bad-value")
            del values[key]
    return Sampling(**values)
