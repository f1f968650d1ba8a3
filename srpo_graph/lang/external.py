"""Checking policies that do not train: ``policy p = "model" frozen`` and ``policy p = openai(...)``.

Stage: lang (check). Consumes policy declarations and agent declarations; produces
:class:`~srpo_graph.workflow.Policy` objects with ``frozen`` / ``external`` set, and reports:

* ``openai("url", model=.., api_key_env=.., timeout=.., retries=.., concurrency=..)``: the URL is
  ``http(s)://``, each argument known, typed and in range, the API key named by an environment
  variable (never written in the file: an ``api_key=`` argument is refused);
* ``lora(...) frozen``: refused (a frozen adapter has no weights to load; freeze the merged model);
* an external policy as the base of adapters: refused (its weights are not here);
* an agent of an external policy with options an API cannot honour: ``allow:`` (no logit
  processor over an API) and ``top_k`` (not a chat-completions parameter).

Knows nothing of HTTP: the runtime's client is ``srpo_graph.backends.openai``.
"""

from __future__ import annotations

from typing import Any

from srpo_graph.errors import Span
from srpo_graph.lang import ast
from srpo_graph.workflow import ExternalModel, Policy

# argument -> (python type, range predicate, what the message says)
_ARGS: dict[str, tuple[type, Any, str]] = {
    "model": (str, lambda v: bool(v.strip()), "a non-empty model name"),
    "api_key_env": (str, lambda v: v.replace("_", "a").isalnum() and not v[0].isdigit(),
                    "an environment variable name, e.g. OPENAI_API_KEY"),
    "timeout": (float, lambda v: 0 < v <= 3600, "seconds in (0, 3600]"),
    "retries": (int, lambda v: 0 <= v <= 10, "an integer in [0, 10]"),
    "concurrency": (int, lambda v: 1 <= v <= 1024, "an integer in [1, 1024]"),
}
# sampling options an OpenAI-compatible chat-completions API cannot honour -> why
UNSUPPORTED_SAMPLING = {
    "allow": "an API applies no logit processor, so outputs cannot be constrained to tokens",
    "top_k": "top_k is not a chat-completions parameter",
}


def check_openai(ck, decl: ast.PolicyDecl) -> Policy:
    """The external policy ``decl`` declares (``decl.model`` is an :class:`~srpo_graph.lang.ast.OpenaiExpr`)."""
    expr: ast.OpenaiExpr = decl.model  # type: ignore[assignment]
    url = expr.url.value.strip()
    if not (url.startswith("http://") or url.startswith("https://")) or len(url) <= len("http://"):
        ck.err(f"'{expr.url.value}' is not an http(s) URL", expr.url.span,
               'give the API base, e.g. openai("http://127.0.0.1:30000/v1", model="name")', "bad-value")
    values: dict[str, object] = {}
    seen: dict[str, Span] = {}
    for arg in expr.args:
        key = arg.key.value
        if key == "api_key":
            ck.err("an API key is never written in a workflow file", arg.span,
                   'name the environment variable that holds it: api_key_env="OPENAI_API_KEY"', "secret-in-source")
            continue
        if key not in _ARGS:
            ck.err(
                f"unknown openai argument '{key}'", arg.key.span, f"openai takes {', '.join(_ARGS)}", "unknown-field"
            )
            continue
        if not ck.unique(arg.key, seen, "openai argument"):
            continue
        kind, ok, what = _ARGS[key]
        v = arg.value
        raw = v.value if isinstance(v, (ast.StringLit, ast.NumberLit)) else None
        typed_ok = (
            isinstance(v, ast.StringLit)
            if kind is str
            else isinstance(v, ast.NumberLit) and (kind is float or isinstance(raw, int))
        )
        if not typed_ok or not ok(raw):
            ck.err(f"`{key}` must be {what}, got {raw!r}", v.span, f"write `{key}=` {what}", "bad-value")
            continue
        values[key] = float(raw) if kind is float else raw
    if decl.frozen is not None:
        ck.sink.warning(
            f"policy '{decl.name.value}' is external, so always frozen; `frozen` changes nothing",
            decl.frozen,
            "remove `frozen`",
            "redundant-frozen",
        )
    external = ExternalModel(url=url.rstrip("/"), **values)
    return Policy(name=decl.name.value, model=external.url, span=decl.span, frozen=True, external=external)


def check_not_trained(ck, decls: list[ast.PolicyDecl], policies: dict[str, Policy]) -> None:
    """Rules across declarations: a frozen adapter, an adapter on an external policy."""
    for d in decls:
        if isinstance(d.model, ast.LoraExpr):
            if d.frozen is not None:
                ck.err(
                    f"adapter '{d.name.value}' cannot be frozen",
                    d.frozen,
                    "a frozen adapter has no weights to load; merge it into a model and declare "
                    '`policy NAME = "path/to/merged" frozen`',
                    "frozen-adapter",
                )
            base = policies.get(d.model.base.value)
            if base is not None and base.external is not None:
                ck.err(
                    f"external policy '{base.name}' cannot be the base of adapter '{d.name.value}'",
                    d.model.base.span,
                    "its weights are behind an API, not here; name a local model as the base",
                    "external-base",
                )


def check_external_agent(ck, a: ast.AgentDecl, policies: dict[str, Policy]) -> None:
    """An agent of an external policy declares no option the API cannot honour (each error located)."""
    pol_item = next((i for i in a.items if isinstance(i, ast.PolicyItem)), None)
    pol = policies.get(pol_item.policy.value) if pol_item is not None else None
    if pol is None or pol.external is None:
        return
    for item in a.items:
        if isinstance(item, ast.SampleItem):
            for e in item.entries:
                why = UNSUPPORTED_SAMPLING.get(e.key.value)
                if why is not None:
                    ck.err(
                        f"agent '{a.name.value}' samples external policy '{pol.name}', which cannot honour "
                        f"`{e.key.value}`",
                        e.key.span,
                        f"{why}; remove it or use a local policy",
                        "unsupported-option",
                    )
