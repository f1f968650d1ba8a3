"""Check a parsed ``.wf`` module and build the typed :class:`~srpo_graph.workflow.Workflow`.

Stage: lang (check). Consumes an :class:`~srpo_graph.lang.ast.Module`, produces a ``Workflow``
(plus warnings). This module resolves names, imports and types declaration by declaration;
:mod:`srpo_graph.lang.analysis` then checks the graph rules (consumption, reachability,
bounded cycles, references produced on every path) and proves the active-set sizes.
Every problem is collected; if any is an error, one :class:`WorkflowCheckError` is raised
with all of them (rendered, capped "... and N more").
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from pydantic import ValidationError

from srpo_graph.errors import Diagnostic, DiagnosticSink, Span, WorkflowCheckError
from srpo_graph.lang import ast
from srpo_graph.lang.callables import check_call, import_module, python_module_name, return_annotation, returns_fit, wf_type_of
from srpo_graph.workflow import (
    END,
    ActivateAgents,
    ActivateEnd,
    ActivateRoute,
    Agent,
    BoolType,
    Call,
    ChoiceType,
    FloatType,
    Import,
    IntType,
    ListType,
    Literal_,
    Policy,
    RecordType,
    Ref,
    Sampling,
    Template,
    TextPart,
    TextType,
    ToolCall,
    Transition,
    WfType,
    Workflow,
    source_hash,
    type_str,
)

RESERVED = {"start", "end", "task"}
_SIMPLE = {"text": TextType(), "int": IntType(), "float": FloatType(), "bool": BoolType()}
# Extractor used when an output has no `via`: {type kind: std function}.
DEFAULT_EXTRACTORS = {"text": "text", "int": "last_int", "choice": "choice", "record": "json_record"}
_SAMPLING_KEYS = {"temperature": float, "top_p": float, "top_k": int, "max_tokens": int, "stop": list, "allow": list}


@dataclass
class CheckResult:
    """What ``check`` proves: the workflow, its warnings and the static analysis."""

    workflow: Workflow
    warnings: list[Diagnostic] = field(default_factory=list)
    max_firings: int = 0  # bound on transition firings in one episode
    bound_reason: str = ""


def check(module: ast.Module, source: str | None = None, *, base_dir: str | Path | None = None) -> Workflow:
    """Check a parsed module and build its :class:`Workflow` (warnings: see :func:`check_module`).

    Args:
        module: the parsed module.
        source: its text (defaults to ``module.source``), used to render errors.
        base_dir: the directory searched first for imported modules (default: the file's).

    Returns:
        The workflow.

    Raises:
        WorkflowCheckError: one or more name, type or graph rules are broken (all reported).

    >>> from srpo_graph.lang.parser import parse
    >>> w = check(parse('''workflow w
    ... import std
    ... policy p = "tiny"
    ... agent a { policy: p  prompt: "hi"  output: int }
    ... transition t { consume: a  activate: end }
    ... start: a'''))
    >>> w.agents[0].extractor.qualname, w.transitions[0].set_sizes
    ('std.last_int', (1,))
    """
    return check_module(module, source, base_dir=base_dir).workflow


def check_module(module: ast.Module, source: str | None = None, *, base_dir: str | Path | None = None) -> CheckResult:
    """Like :func:`check`, returning the warnings and the episode bound as well."""
    from srpo_graph.lang.analysis import analyze

    source = module.source if source is None else source
    if base_dir is None and not module.path.startswith("<"):
        base_dir = Path(module.path).resolve().parent
    ck = _Checker(module, Path(base_dir) if base_dir is not None else None)
    draft = ck.run()
    result = analyze(draft, ck.sink, ck.decl_spans, ck.uses)
    if ck.sink.errors:
        diags = sorted(ck.sink.errors, key=lambda d: (d.span.line, d.span.col) if d.span else (0, 0))
        raise WorkflowCheckError(diagnostics=diags, source=source)
    try:
        workflow = Workflow.model_validate(
            {**draft.model_dump(), "transitions": [t.model_dump() for t in result.transitions],
             "source_hash": source_hash(source)}
        )
    except ValidationError as exc:  # a bug in the checker, never the user's: still no raw traceback
        raise WorkflowCheckError(f"{module.path}: error: internal check failure: {exc.errors()[0]['msg']}") from None
    return CheckResult(workflow, ck.sink.warnings + result.warnings, result.max_firings, result.bound_reason)


def close_names(name: str, known) -> str | None:
    """A "did you mean" hint, or the list of known names when short."""
    known = sorted(set(known))
    match = difflib.get_close_matches(name, known, n=1)
    if match:
        return f"did you mean '{match[0]}'?"
    if known and len(known) <= 8:
        return "known names: " + ", ".join(known)
    return None


@dataclass
class Uses:
    """References whose availability depends on paths (checked by the analysis)."""

    agent_refs: dict[str, list[Ref]] = field(default_factory=dict)  # agent -> template refs
    tool_refs: dict[str, list[tuple[int, Ref]]] = field(default_factory=dict)  # transition -> (tool index, ref)
    reward_refs: dict[str, list[Ref]] = field(default_factory=dict)  # transition -> reward refs
    route_refs: dict[str, Ref] = field(default_factory=dict)
    terminal_refs: list[Ref] = field(default_factory=list)
    unconsumed_ok: set[str] = field(default_factory=set)
    consume_spans: dict[tuple[str, str], Span] = field(default_factory=dict)  # (transition, agent) -> span
    incomplete: bool = False  # a transition without `activate`: graph rules on `end` are skipped


class _Checker:
    def __init__(self, module: ast.Module, base_dir: Path | None):
        self.m = module
        self.base_dir = base_dir
        self.sink = DiagnosticSink()
        self.uses = Uses()
        self.decl_spans: dict[str, Span] = {}
        self.modules: dict[str, tuple[str, ModuleType | None, Span]] = {}
        self.task_fields: dict[str, WfType] = {}
        self.policies: dict[str, Policy] = {}
        self.agent_types: dict[str, WfType] = {}
        self.tool_types: dict[str, WfType] = {}

    # -- helpers -------------------------------------------------------------------
    def err(self, message, span, hint=None, code="E"):
        self.sink.error(message, span, hint, code)

    def _unique(self, name: ast.Name, seen: dict[str, Span], what: str) -> bool:
        if name.value in seen:
            prev = seen[name.value]
            self.err(f"duplicate {what} '{name.value}'", name.span,
                     f"'{name.value}' is already declared at line {prev.line}", "duplicate-name")
            return False
        seen[name.value] = name.span
        return True

    # -- the pass ---------------------------------------------------------------------
    def run(self) -> Workflow:
        items = self.m.items
        for it in items:
            if isinstance(it, ast.ImportStmt):
                self._import(it)
        tasks = [it for it in items if isinstance(it, ast.TaskBlock)]
        for extra in tasks[1:]:
            self.err("a second `task` block", extra.span, "declare every task field in one block", "duplicate-name")
        for blk in tasks[:1]:
            seen: dict[str, Span] = {}
            for f in blk.fields:
                if self._unique(f.name, seen, "task field"):
                    self.task_fields[f.name.value] = self.type_of(f.type)
        seen_pol: dict[str, Span] = {}
        for it in items:
            if isinstance(it, ast.PolicyDecl) and self._unique(it.name, seen_pol, "policy"):
                if not it.model.value.strip():
                    self.err("empty model name", it.model.span, 'use "tiny", a Hugging Face name or a local path')
                self.policies[it.name.value] = Policy(name=it.name.value, model=it.model.value, span=it.span)
        agents = [it for it in items if isinstance(it, ast.AgentDecl)]
        transitions = [it for it in items if isinstance(it, ast.TransitionDecl)]
        for node in agents + transitions:
            name = node.name
            if name.value in RESERVED:
                self.err(f"'{name.value}' is reserved and cannot name a node", name.span, code="reserved-name")
            elif self._unique(name, self.decl_spans, "node name"):
                pass
        for a in agents:  # output types first: templates may refer to any agent
            out = next((i for i in a.items if isinstance(i, ast.OutputItem)), None)
            self.agent_types.setdefault(a.name.value, self.type_of(out.type) if out else TextType())
        for t in transitions:  # tool variables are global names too
            for i in t.items:
                if isinstance(i, ast.ToolItem):
                    self._tool_name(i)
        built_agents = [x for x in (self._agent(a) for a in agents) if x is not None]
        built_transitions = [x for x in (self._transition(t) for t in transitions) if x is not None]
        start, reward, max_steps = self._top_level(items)
        header = self.m.header
        return Workflow.model_construct(
            name=header.name.value,
            description=header.description.value if header.description else "",
            path=self.m.path,
            source_hash="",
            imports=tuple(Import(module=mod, alias=alias, span=span) for alias, (mod, _, span) in self.modules.items()),
            task_fields=tuple(self.task_fields.items()),
            policies=tuple(self.policies.values()),
            agents=tuple(built_agents),
            transitions=tuple(built_transitions),
            start=start,
            reward=reward,
            max_steps=max_steps,
            span=self.m.span,
        )

    def _import(self, it: ast.ImportStmt) -> None:
        dotted = it.dotted
        alias = it.alias.value if it.alias else it.module[-1].value if len(it.module) == 1 else None
        if alias is None:
            self.err(f"import of a dotted module '{dotted}' needs an alias", it.span,
                     f"write `import {dotted} as NAME`", "bad-import")
            return
        if alias in self.modules:
            self.err(f"duplicate import name '{alias}'", (it.alias or it.module[0]).span, code="duplicate-name")
            return
        try:
            mod = import_module(dotted, self.base_dir)
        except ImportError as exc:
            # the directory as the user named it (relative paths stay relative: messages are reproducible)
            shown = Path(self.m.path).parent if not self.m.path.startswith("<") else self.base_dir
            where = f" (searched sys.path and {shown or '.'})" if self.base_dir else ""
            cause = str(exc).splitlines()[0] if str(exc) else "module not found"
            self.err(f"cannot import module '{dotted}': {cause}", Span(
                path=it.span.path, line=it.module[0].span.line, col=it.module[0].span.col,
                end_line=it.module[-1].span.end_line, end_col=it.module[-1].span.end_col),
                f"put {dotted.replace('.', '/')}.py next to the .wf file or install it{where}", "bad-import")
            mod = None
        self.modules[alias] = (python_module_name(dotted), mod, it.span)

    def _tool_name(self, i: ast.ToolItem) -> None:
        name = i.name
        if name.value in RESERVED or name.value in self.decl_spans or name.value in self.tool_types:
            self.err(f"tool variable '{name.value}' clashes with another name", name.span,
                     "give each tool result its own name (not an agent, transition or another tool)", "duplicate-name")
            return
        call = self.resolve_call(i.call, "tool")
        t = None
        if call is not None and call[1] is not None:
            ann = return_annotation(call[1])
            t = wf_type_of(ann)
            if t is None:
                self.err(f"tool {i.call.module.value}.{i.call.function.value} has no usable return annotation",
                         i.call.span, "annotate its return type (str, int, float, bool, list[...] or dict)",
                         "bad-signature")
        self.tool_types[name.value] = t if t is not None else TextType()

    # -- types and values ----------------------------------------------------------------
    def type_of(self, t: ast.TypeExpr) -> WfType:
        if isinstance(t, ast.SimpleType):
            return _SIMPLE[t.name]
        if isinstance(t, ast.ChoiceTypeExpr):
            seen: dict[str, Span] = {}
            for o in t.options:
                self._unique(o, seen, "choice label")
            return ChoiceType(options=tuple(seen), multi=t.multi)
        if isinstance(t, ast.ListTypeExpr):
            return ListType(item=self.type_of(t.item))
        seen_f: dict[str, Span] = {}
        fields = []
        for f in t.fields:
            if self._unique(f.name, seen_f, "record field"):
                fields.append((f.name.value, self.type_of(f.type)))
        return RecordType(fields=tuple(fields))

    def ref_type(self, ref: ast.Ref, *, allow_agents: bool = True) -> WfType | None:
        """Type of a reference, or None (reported) when it names nothing."""
        head, rest = ref.path[0], list(ref.path[1:])
        span = ref.span
        if head == "task":
            if not rest:
                self.err("`task` alone is not a value", span, "refer to a field: task.FIELD", "unknown-name")
                return None
            fname = rest.pop(0)
            if fname not in self.task_fields:
                self.err(f"unknown task field '{fname}'", span,
                         (close_names(fname, self.task_fields) or "").replace("known names", "task fields")
                         or "declare it in the `task { }` block", "unknown-field")
                return None
            t = self.task_fields[fname]
            where = f"task.{fname}"
        elif head in self.agent_types and allow_agents:
            t, where = self.agent_types[head], head
        elif head in self.tool_types:
            t, where = self.tool_types[head], head
        else:
            names = list(self.agent_types) + list(self.tool_types) + ["task"]
            self.err(f"unknown name '{head}' in a reference", span, close_names(head, names), "unknown-name")
            return None
        for fname in rest:
            if not isinstance(t, RecordType):
                self.err(f"'{where}' is {type_str(t)}, not a record: it has no field '{fname}'", span,
                         code="unknown-field")
                return None
            ft = t.field_type(fname)
            if ft is None:
                if not t.fields:  # a dict from a tool: fields unknown statically
                    return None
                self.err(f"'{where}' has no field '{fname}'", span,
                         close_names(fname, [n for n, _ in t.fields]), "unknown-field")
                return None
            t, where = ft, f"{where}.{fname}"
        return t

    def expr(self, e: ast.Expr, refs: list[Ref]) -> tuple[Ref | Literal_, WfType | None]:
        if isinstance(e, ast.Ref):
            r = Ref(path=e.path, optional=e.optional, span=e.span)
            refs.append(r)
            return r, self.ref_type(e)
        lit_type = {ast.StringLit: TextType(), ast.BoolLit: BoolType()}.get(type(e))
        if isinstance(e, ast.NumberLit):
            lit_type = IntType() if isinstance(e.value, int) else FloatType()
        return Literal_(value=e.value, span=e.span), lit_type

    def resolve_call(self, c: ast.Call, role: str):
        """(python module name, function or None) or None when the module is not imported."""
        alias = c.module.value
        if alias not in self.modules:
            hint = f"add `import {alias}`" if alias == "std" else (close_names(alias, self.modules) or f"add `import {alias}`")
            self.err(f"'{alias}' is not an imported module", c.module.span, hint, "unknown-module")
            return None
        modname, mod, _ = self.modules[alias]
        if mod is None:
            return modname, None
        fn = getattr(mod, c.function.value, None)
        if fn is None or not callable(fn):
            public = [n for n in dir(mod) if not n.startswith("_") and callable(getattr(mod, n))]
            self.err(f"module '{alias}' has no function '{c.function.value}'", c.function.span,
                     close_names(c.function.value, public), "unknown-callable")
            return modname, None
        return modname, fn

    def call(self, c: ast.Call, role: str, refs: list[Ref], leading=(), extra_args=()) -> Call | None:
        """Resolve and type-check a call; ``leading`` types are passed first by the runtime."""
        resolved = self.resolve_call(c, role)
        args, kwargs, arg_types, kw_types = [], [], [], {}
        for a in c.args:
            value, t = self.expr(a.value, refs)
            if a.name is None:
                if kwargs:
                    self.err("a positional argument after a keyword argument", a.span, code="bad-call")
                args.append(value)
                arg_types.append(t)
            else:
                if a.name.value in kw_types:
                    self.err(f"keyword argument '{a.name.value}' given twice", a.name.span, code="bad-call")
                kwargs.append((a.name.value, value))
                kw_types[a.name.value] = t
        args.extend(extra_args)
        arg_types.extend(TextType() for _ in extra_args)
        if resolved is None:
            return None
        modname, fn = resolved
        if fn is not None:
            for p in check_call(fn, arg_types, kw_types, leading=leading):
                span = c.args[p.index].span if p.index is not None and p.index < len(c.args) else c.span
                self.err(f"{role} {c.module.value}.{c.function.value}: {p.message}", span,
                         _signature_hint(fn), "type-mismatch" if p.index is not None else "bad-signature")
        return Call(module=modname, alias=c.module.value, function=c.function.value,
                    args=tuple(args), kwargs=tuple(kwargs), span=c.span)

    # -- agents -------------------------------------------------------------------------
    def _agent(self, a: ast.AgentDecl) -> Agent | None:
        name = a.name.value
        by_kind: dict[type, list] = {}
        for i in a.items:
            by_kind.setdefault(type(i), []).append(i)
        for kind, its in by_kind.items():
            for extra in its[1:]:
                self.err(f"agent '{name}' sets `{_ITEM_WORD[kind]}` twice", extra.span, code="duplicate-name")
        pol = by_kind.get(ast.PolicyItem, [None])[0]
        prompt = by_kind.get(ast.PromptItem, [None])[0]
        if pol is None:
            self.err(f"agent '{name}' has no policy", a.name.span,
                     f"add `policy: NAME`; declared policies: {', '.join(self.policies) or 'none'}", "missing-policy")
        elif pol.policy.value not in self.policies:
            self.err(f"unknown policy '{pol.policy.value}'", pol.policy.span,
                     close_names(pol.policy.value, self.policies) or "declare it: policy NAME = \"model\"",
                     "unknown-policy")
        if prompt is None:
            self.err(f"agent '{name}' has no prompt", a.name.span, 'add `prompt: "..."`', "missing-prompt")
        refs: list[Ref] = []
        parts = []
        if prompt is not None:
            for p in prompt.template.parts:
                if isinstance(p, ast.Ref):
                    self.ref_type(p)
                    r = Ref(path=p.path, optional=p.optional, span=p.span)
                    refs.append(r)
                    parts.append(r)
                else:
                    parts.append(TextPart(text=p.text))
        self.uses.agent_refs[name] = refs
        sampling = self._sampling(by_kind.get(ast.SampleItem, [None])[0])
        out = by_kind.get(ast.OutputItem, [None])[0]
        out_type = self.agent_types.get(name, TextType())
        extractor = self._extractor(name, out, out_type)
        for u in by_kind.get(ast.UnconsumedItem, []):
            if u.value.value != "allow":
                self.err(f"unknown value '{u.value.value}' for `unconsumed`", u.value.span,
                         "the only value is `unconsumed: allow`", "bad-value")
            else:
                self.uses.unconsumed_ok.add(name)
        # an agent with errors is still built (its problems are reported) so the graph rules run
        return Agent.model_construct(
            node="agent", name=name, policy=pol.policy.value if pol else "",
            template=Template(parts=tuple(parts), span=prompt.template.span if prompt else None),
            sampling=sampling, output=out_type, span=a.span,
            extractor=extractor or Call(module="?", alias="?", function="?"),
        )

    def _extractor(self, agent: str, out: ast.OutputItem | None, t: WfType) -> Call | None:
        options = tuple(Literal_(value=o) for o in t.options) if isinstance(t, ChoiceType) else ()
        if out is None or out.via is None:
            kind = "choice" if isinstance(t, ChoiceType) else t.kind
            fn_name = DEFAULT_EXTRACTORS.get(kind)
            if isinstance(t, ChoiceType) and t.multi:
                fn_name = "choices"
            if fn_name is None:
                self.err(f"no default extractor for a {type_str(t)} output", out.type.span if out else None,
                         "name one: `output: TYPE via module.function`", "missing-extractor")
                return None
            return Call(module="srpo_graph.std", alias="std", function=fn_name, args=options,
                        span=out.span if out else None)
        refs: list[Ref] = []
        for a in out.via.args:
            if isinstance(a.value, ast.Ref):
                self.err("an extractor's arguments must be literals", a.span,
                         "the extractor sees only the completion text and these constants", "bad-call")
        extra = options if (isinstance(t, ChoiceType) and not out.via.args) else ()
        call = self.call(out.via, "extractor", refs, leading=(TextType(),), extra_args=extra)
        if call is None:
            return Call(module="?", alias=out.via.module.value, function=out.via.function.value)
        mod = self.modules.get(out.via.module.value, (None, None, None))[1]
        fn = getattr(mod, out.via.function.value, None) if mod is not None else None
        if fn is not None and callable(fn) and not returns_fit(t, return_annotation(fn)):
            self.err(f"extractor {call.qualname} returns {_ret_str(fn)}, but the output is declared {type_str(t)}",
                     out.via.span, "change the output type or use an extractor that returns it", "type-mismatch")
        return call

    def _sampling(self, s: ast.SampleItem | None) -> Sampling:
        if s is None:
            return Sampling()
        values: dict = {}
        seen: dict[str, Span] = {}
        for e in s.entries:
            key = e.key.value
            if key not in _SAMPLING_KEYS:
                self.err(f"unknown sampling parameter '{key}'", e.key.span,
                         close_names(key, _SAMPLING_KEYS), "unknown-name")
                continue
            if not self._unique(e.key, seen, "sampling parameter"):
                continue
            want, v = _SAMPLING_KEYS[key], e.value
            if want is list:
                items = v.items if isinstance(v, ast.ListLit) else (v,)
                if not all(isinstance(x, ast.StringLit) and x.value for x in items):
                    self.err(f"`{key}` takes a list of non-empty strings", e.value.span, code="type-mismatch")
                    continue
                values[key] = tuple(x.value for x in items)
            elif not isinstance(v, ast.NumberLit) or (want is int and not isinstance(v.value, int)):
                self.err(f"`{key}` takes {'an integer' if want is int else 'a number'}", e.value.span,
                         code="type-mismatch")
            else:
                values[key] = want(v.value)
        checks = {"temperature": (lambda x: x > 0, "must be > 0"), "top_p": (lambda x: 0 < x <= 1, "must be in (0, 1]"),
                  "top_k": (lambda x: x >= 0, "must be >= 0 (0 = off)"), "max_tokens": (lambda x: x >= 1, "must be >= 1")}
        for key, (ok, why) in checks.items():
            if key in values and not ok(values[key]):
                entry = next(e for e in s.entries if e.key.value == key)
                self.err(f"`{key}` {why}", entry.value.span, code="bad-value")
                del values[key]
        return Sampling(**values)

    # -- transitions ---------------------------------------------------------------------
    def _transition(self, t: ast.TransitionDecl) -> Transition | None:
        name = t.name.value
        by_kind: dict[type, list] = {}
        for i in t.items:
            by_kind.setdefault(type(i), []).append(i)
        for kind in (ast.ConsumeItem, ast.RewardItem, ast.ActivateItem, ast.MaxRoundsItem):
            for extra in by_kind.get(kind, [])[1:]:
                self.err(f"transition '{name}' sets `{_ITEM_WORD[kind]}` twice", extra.span, code="duplicate-name")
        consume_item = by_kind.get(ast.ConsumeItem, [None])[0]
        consume: list[str] = []
        if consume_item is None:
            self.err(f"transition '{name}' consumes nothing", t.name.span, "add `consume: AGENT, ...`", "missing-consume")
        else:
            seen: dict[str, Span] = {}
            for n in consume_item.agents:
                if n.value not in self.agent_types:
                    self.err(f"transition '{name}' consumes unknown agent '{n.value}'", n.span,
                             close_names(n.value, self.agent_types), "unknown-name")
                elif self._unique(n, seen, "consumed agent"):
                    consume.append(n.value)
                    self.uses.consume_spans[(name, n.value)] = n.span
        tools = []
        tool_refs: list[tuple[int, Ref]] = []
        for k, ti in enumerate(by_kind.get(ast.ToolItem, [])):
            refs: list[Ref] = []
            call = self.call(ti.call, "tool", refs)
            tool_refs.extend((k, r) for r in refs)
            if call is not None and ti.name.value in self.tool_types:
                tools.append(ToolCall(name=ti.name.value, call=call, type=self.tool_types[ti.name.value], span=ti.span))
        self.uses.tool_refs[name] = tool_refs
        reward = None
        for ri in by_kind.get(ast.RewardItem, [])[:1]:
            refs = []
            reward = self._reward(ri.call, refs)
            self.uses.reward_refs[name] = refs
        act_item = by_kind.get(ast.ActivateItem, [None])[0]
        activation = None
        if act_item is None:
            self.err(f"transition '{name}' activates nothing", t.name.span,
                     "add `activate: AGENT, ...`, `activate: end` or `activate: route ...`", "missing-activate")
        else:
            activation = self._activation(name, act_item.activation)
        max_rounds = None
        for mr in by_kind.get(ast.MaxRoundsItem, [])[:1]:
            if mr.value.value < 1:
                self.err("`max_rounds` must be >= 1", mr.value.span, code="bad-value")
            else:
                max_rounds = int(mr.value.value)
        if activation is None:
            self.uses.incomplete = True
            return None
        return Transition.model_construct(
            node="transition", name=name, consume=tuple(consume), tools=tuple(tools), reward=reward,
            activate=activation, max_rounds=max_rounds, set_sizes=(), span=t.span,
        )

    def _reward(self, c: ast.Call, refs: list[Ref]) -> Call | None:
        call = self.call(c, "reward", refs)
        mod = self.modules.get(c.module.value, (None, None, None))[1]
        fn = getattr(mod, c.function.value, None) if mod is not None else None
        if call is not None and fn is not None and callable(fn) and not returns_fit(FloatType(), return_annotation(fn)):
            self.err(f"reward {call.qualname} returns {_ret_str(fn)}, not a number", c.span,
                     "a reward function returns a float", "type-mismatch")
        return call

    def _activation(self, tname: str, act):
        if isinstance(act, ast.ActivateEnd):
            return ActivateEnd()
        if isinstance(act, ast.ActivateAgents):
            names = []
            for n in act.agents:
                if n.value not in self.agent_types:
                    self.err(f"transition '{tname}' activates unknown agent '{n.value}'", n.span,
                             close_names(n.value, self.agent_types), "unknown-name")
                else:
                    names.append(n.value)
            return ActivateAgents(agents=tuple(names))
        on = Ref(path=act.on.path, optional=act.on.optional, span=act.on.span)
        self.uses.route_refs[tname] = on
        t = self.ref_type(act.on)
        if t is None or not isinstance(t, ChoiceType):
            self.uses.incomplete = True  # no targets known: the rules about `end` would only add noise
        if t is None:
            return ActivateRoute(on=on, cases=())
        if not isinstance(t, ChoiceType):
            self.err(f"cannot route on '{on}': it is {type_str(t)}, not a choice", act.on.span,
                     "route on an output declared `choice[...]` or `choices[...]`", "type-mismatch")
            return ActivateRoute(on=on, cases=())
        if act.cases is None:
            cases = []
            for label in t.options:
                if label != END and label not in self.agent_types:
                    self.err(f"router choice '{label}' is not an agent", act.on.span,
                             f"the labels of {type_str(t)} must name agents (or end), or give explicit cases:"
                             f" route {on} {{ {label} -> AGENT }}", "router-target")
                cases.append((label, (END,) if label == END else (label,)))
            return ActivateRoute(on=on, cases=tuple(cases))
        cases, seen = [], {}
        for case in act.cases:
            if case.label.value not in t.options:
                self.err(f"'{case.label.value}' is not a label of {type_str(t)}", case.label.span,
                         close_names(case.label.value, t.options), "router-target")
                continue
            if not self._unique(case.label, seen, "route case"):
                continue
            targets = []
            for n in case.targets:
                if n.value != END and n.value not in self.agent_types:
                    self.err(f"route case '{case.label.value}' names '{n.value}', which is not an agent", n.span,
                             close_names(n.value, list(self.agent_types) + [END]), "router-target")
                else:
                    targets.append(n.value)
            cases.append((case.label.value, tuple(targets)))
        for label in t.options:
            if label not in seen:
                self.sink.warning(f"route on '{on}' has no case for '{label}': that choice ends the episode",
                                  act.span, f"add `{label} -> end` to say so", "route-default")
        return ActivateRoute(on=on, cases=tuple(cases))

    # -- workflow-level ------------------------------------------------------------------
    def _top_level(self, items):
        starts = [i for i in items if isinstance(i, ast.StartStmt)]
        rewards = [i for i in items if isinstance(i, ast.RewardStmt)]
        steps = [i for i in items if isinstance(i, ast.MaxStepsStmt)]
        for group, word in ((starts, "start"), (rewards, "reward"), (steps, "max_steps")):
            for extra in group[1:]:
                self.err(f"`{word}` is given twice", extra.span, code="duplicate-name")
        start: tuple[str, ...] = ()
        if not starts:
            self.err("the workflow has no `start`", self.m.header.span, "add `start: AGENT, ...`", "missing-start")
        else:
            names, seen = [], {}
            for n in starts[0].agents:
                if n.value not in self.agent_types:
                    self.err(f"start names unknown agent '{n.value}'", n.span,
                             close_names(n.value, self.agent_types), "unknown-name")
                elif self._unique(n, seen, "start agent"):
                    names.append(n.value)
            start = tuple(names)
        reward = None
        if rewards:
            reward = self._reward(rewards[0].call, self.uses.terminal_refs)
        max_steps = 32
        if steps:
            if steps[0].value.value < 1:
                self.err("`max_steps` must be >= 1", steps[0].value.span, code="bad-value")
            else:
                max_steps = int(steps[0].value.value)
        return start, reward, max_steps


_ITEM_WORD = {
    ast.PolicyItem: "policy", ast.PromptItem: "prompt", ast.SampleItem: "sample", ast.OutputItem: "output",
    ast.UnconsumedItem: "unconsumed", ast.ConsumeItem: "consume", ast.RewardItem: "reward",
    ast.ActivateItem: "activate", ast.MaxRoundsItem: "max_rounds", ast.ToolItem: "tool",
}


def _signature_hint(fn) -> str:
    import inspect

    from srpo_graph.lang.callables import _hints

    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return ""
    hints = _hints(fn)

    def ann(a):
        return getattr(a, "__name__", None) or str(a).replace("typing.", "")

    params = [p.replace(annotation=ann(hints[p.name])) if p.name in hints else p for p in sig.parameters.values()]
    ret = ann(hints["return"]) if "return" in hints else sig.return_annotation
    text = str(sig.replace(parameters=params, return_annotation=ret)).replace("'", "")
    return f"its signature is {getattr(fn, '__name__', 'fn')}{text}"


def _ret_str(fn) -> str:
    from srpo_graph.lang.callables import _ann_str

    return _ann_str(return_annotation(fn))
