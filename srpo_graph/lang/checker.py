"""Check a parsed ``.wf`` module and build the typed :class:`~srpo_graph.workflow.Workflow`.

Stage: lang (check). Consumes an :class:`~srpo_graph.lang.ast.Module`, produces a ``Workflow``
(plus warnings). The pass, in order: imports, the task block, policies, node names, agent output
types and tool result types (so any declaration may refer to any other), then each agent
(:mod:`.agents`), each transition (:mod:`.transitions`) and the top-level statements; names,
types and calls are resolved through :class:`~srpo_graph.lang.scope.Scope`.
:mod:`srpo_graph.lang.analysis` then checks the graph rules (consumption, reachability, bounded
cycles, references produced on every path) and proves the active-set sizes.
Every problem is collected; if any is an error, one :class:`WorkflowCheckError` is raised
with all of them (rendered, capped "... and N more").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from srpo_graph.errors import Diagnostic, Span, WorkflowCheckError
from srpo_graph.lang import ast
from srpo_graph.lang.adapters import check_lora
from srpo_graph.lang.agents import DEFAULT_EXTRACTORS, build_agent
from srpo_graph.lang.callables import import_module, python_module_name, return_annotation, wf_type_of
from srpo_graph.lang.external import check_external_agent, check_not_trained, check_openai
from srpo_graph.lang.scope import MAX_COUNT, Scope, Uses, close_names
from srpo_graph.lang.transitions import build_transition
from srpo_graph.workflow import Import, Policy, TextType, Workflow, source_hash, type_str

# Names a node, tool result or import alias cannot take: each is read as a keyword or literal
# where a name may stand (`activate: end`, `activate: route r`, `f(true)`, `{task.x}`), so a node
# so named could never be referred to unambiguously.
RESERVED = {"start", "end", "task", "true", "false", "route"}
_RESERVED_WHY = {"start": "the start list", "end": "the end of an episode", "task": "the task record",
                 "true": "a literal", "false": "a literal", "route": "a keyword of `activate:`"}


ALLOWED_IMPORTS_ENV = "SRPO_GRAPH_ALLOWED_IMPORTS"


@dataclass(frozen=True)
class ImportPolicy:
    """Which Python modules a ``.wf`` file may make the checker import (and so run).

    ``check``, ``viz``, ``run`` and ``train`` import every module a file names, which runs its
    code. ``allowed``: module names (``my_tools``) or package prefixes (``pkg.*``) that may be
    imported, None = any; ``std`` is always allowed (it is srpo-graph's own). ``no_import``:
    import nothing but ``std``; everything else is checked, except what needs the functions of
    other modules themselves (that they exist, their signatures and return types).

    >>> ImportPolicy(allowed=("tools", "pkg.*")).permits("pkg.sub"), ImportPolicy(allowed=("tools",)).permits("other")
    (True, False)
    """

    allowed: tuple[str, ...] | None = None
    no_import: bool = False

    @classmethod
    def from_env(cls) -> "ImportPolicy":
        """The policy of ``$SRPO_GRAPH_ALLOWED_IMPORTS`` (comma-separated names; unset = any)."""
        import os

        raw = os.environ.get(ALLOWED_IMPORTS_ENV)
        if raw is None:
            return cls()
        return cls(allowed=tuple(x.strip() for x in raw.split(",") if x.strip()))

    def permits(self, dotted: str) -> bool:
        if dotted == "std" or self.allowed is None:
            return True
        return any(dotted == a or (a.endswith(".*") and dotted.startswith(a[:-1])) for a in self.allowed)


@dataclass
class CheckResult:
    """What ``check`` proves: the workflow, its warnings and the static analysis."""

    workflow: Workflow
    warnings: list[Diagnostic] = field(default_factory=list)
    max_firings: int = 0  # bound on transition firings in one episode
    bound_reason: str = ""
    # tools whose function was not imported (`--no-import`, the editor): their result type is unknown
    untyped_tools: frozenset[str] = frozenset()


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


def check_module(module: ast.Module, source: str | None = None, *, base_dir: str | Path | None = None,
                 imports: ImportPolicy | None = None) -> CheckResult:
    """Like :func:`check`, returning the warnings and the episode bound as well.

    Args:
        module: the parsed module.
        source: its text (defaults to ``module.source``), used to render errors.
        base_dir: the directory searched first for imported modules (default: the file's).
        imports: which modules may be imported (default: ``ImportPolicy.from_env()``).

    Returns:
        A :class:`CheckResult`: the workflow, its warnings, and the bound on transition
        firings per episode with the reason for it.

    Raises:
        WorkflowCheckError: one or more name, type or graph rules are broken (all reported).

    >>> from srpo_graph.lang.parser import parse
    >>> r = check_module(parse('workflow w import std policy p = "tiny" agent a { policy: p prompt: "x"'
    ...                        ' unconsumed: allow } start: a'))
    >>> [d.code for d in r.warnings], r.max_firings, r.bound_reason
    (['unconsumed'], 0, 'the graph is acyclic')
    """
    from srpo_graph.lang.advice import model_advice
    from srpo_graph.lang.analysis import analyze

    source = module.source if source is None else source
    if base_dir is None and not module.path.startswith("<"):
        base_dir = Path(module.path).resolve().parent
    ck = _Checker(module, Path(base_dir) if base_dir is not None else None,
                  imports if imports is not None else ImportPolicy.from_env())
    draft = ck.run()
    result = analyze(draft, ck.sink, ck.decl_spans, ck.uses)
    if ck.sink.errors:
        raise WorkflowCheckError(diagnostics=_root_causes_first(ck.sink.errors), source=source)
    try:
        # the nodes are validated already (scope.node); the workflow's own fields and rules here
        fields = {name: getattr(draft, name) for name in Workflow.model_fields}
        workflow = Workflow(**{**fields, "transitions": tuple(result.transitions), "source_hash": source_hash(source)})
    except ValidationError as exc:  # a bug in the checker, never the user's: still no raw traceback
        raise WorkflowCheckError.at(str(module.path), f"internal check failure: {exc.errors()[0]['msg']}") from None
    return CheckResult(workflow, ck.sink.warnings + model_advice(workflow), result.max_firings, result.bound_reason,
                       frozenset(ck.untyped_tools))


# Graph rules judge the graph the declarations describe; while a name or type is wrong (a typo
# in `consume:`), that graph is not the one the user meant and these errors mostly repeat it.
FOLLOW_ON_CODES = ("unconsumed", "unreachable", "no-end", "unbounded-cycle", "not-produced")


def _root_causes_first(errors: list[Diagnostic]) -> list[Diagnostic]:
    """Errors in source order; when any is a name/type/syntax error, the graph-rule errors are
    folded into one closing line that names them (nothing is lost: they are counted by rule and
    listed by node, and come back in full once the errors above are fixed)."""
    by_place = lambda d: (d.span.line, d.span.col) if d.span else (10**9, 0)  # noqa: E731
    roots = sorted((d for d in errors if d.code not in FOLLOW_ON_CODES), key=by_place)
    follow = sorted((d for d in errors if d.code in FOLLOW_ON_CODES), key=by_place)
    if not roots or not follow:
        return sorted(errors, key=by_place)
    counts: dict[str, int] = {}
    for d in follow:
        counts[d.code] = counts.get(d.code, 0) + 1
    listed = "; ".join(d.message.split(":")[0] for d in follow[:4]) + ("; ..." if len(follow) > 4 else "")
    summary = ", ".join(f"{n} {code}" for code, n in counts.items())
    note = Diagnostic(f"{len(follow)} more error{'s' if len(follow) > 1 else ''} of the graph rules may follow from "
                      f"the ones above ({summary}): {listed}",
                      hint="fix the errors above first; `check` then reports the graph rules in full",
                      code="follow-on")
    return roots + [note]


class _Checker(Scope):
    """One pass over a module's declarations, in dependency order (see the module docstring)."""

    def __init__(self, module: ast.Module, base_dir: Path | None, imports: ImportPolicy = ImportPolicy()):
        super().__init__(base_dir)
        self.m = module
        self.imports = imports

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
                if self.unique(f.name, seen, "task field"):
                    self.task_fields[f.name.value] = self.type_of(f.type)
        seen_pol: dict[str, Span] = {}
        decls = [it for it in items if isinstance(it, ast.PolicyDecl) and self.unique(it.name, seen_pol, "policy")]
        full: dict[str, Policy] = {}
        for it in decls:
            if isinstance(it.model, ast.StringLit):
                if not it.model.value.strip():
                    self.err("empty model name", it.model.span, 'use "tiny", a Hugging Face name or a local path')
                full[it.name.value] = Policy(name=it.name.value, model=it.model.value, span=it.span,
                                             frozen=it.frozen is not None)
            elif isinstance(it.model, ast.OpenaiExpr):  # external: never a base (check_not_trained)
                full[it.name.value] = check_openai(self, it)
        adapters = {it.name.value: it.model.base.value for it in decls if isinstance(it.model, ast.LoraExpr)}
        for it in decls:  # declaration order; a lora(...) adapter needs every full policy first
            self.policies[it.name.value] = full.get(it.name.value) or check_lora(self, it, full, adapters)
        check_not_trained(self, decls, self.policies)
        agents = [it for it in items if isinstance(it, ast.AgentDecl)]
        transitions = [it for it in items if isinstance(it, ast.TransitionDecl)]
        for node in agents + transitions:
            name = node.name
            if name.value in RESERVED:
                self.err(f"'{name.value}' is reserved and cannot name a node", name.span,
                         f"'{name.value}' means {_RESERVED_WHY[name.value]}; choose another name", "reserved-name")
            elif self.unique(name, self.decl_spans, "node name"):
                pass
        for a in agents:  # output types first: templates may refer to any agent
            out = next((i for i in a.items if isinstance(i, ast.OutputItem)), None)
            self.agent_types.setdefault(a.name.value, self.type_of(out.type) if out else TextType())
        for t in transitions:  # tool variables are names of the episode's state (Note [Tool names])
            for i in t.items:
                if isinstance(i, ast.ToolItem):
                    self._tool_name(i, t.name.value)
        for a in agents:
            check_external_agent(self, a, self.policies)
        built_agents = [x for x in (build_agent(self, a) for a in agents) if x is not None]
        built_transitions = [x for x in (build_transition(self, t) for t in transitions) if x is not None]
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
            first = self.modules[alias][2]
            self.err(f"duplicate import name '{alias}'", (it.alias or it.module[0]).span,
                     f"'{alias}' is already imported on line {first.line}: delete this import, or give it another "
                     f"name with `import {dotted} as OTHER`", "duplicate-name")
            return
        if alias in RESERVED:
            self.err(f"'{alias}' is reserved and cannot name an import", (it.alias or it.module[0]).span,
                     f"'{alias}' means {_RESERVED_WHY[alias]}; write `import {dotted} as OTHER`", "reserved-name")
            return
        span = Span(path=it.span.path, line=it.module[0].span.line, col=it.module[0].span.col,
                    end_line=it.module[-1].span.end_line, end_col=it.module[-1].span.end_col)
        if not self.imports.permits(dotted):
            allowed = ", ".join(self.imports.allowed or ()) or "none"
            self.err(f"module '{dotted}' may not be imported (allowed: std, {allowed})", span,
                     f"importing runs the module's code; allow it with --allow-import {dotted} or in "
                     f"${ALLOWED_IMPORTS_ENV}", "bad-import")
            self.modules[alias] = (python_module_name(dotted), None, it.span)
            return
        if self.imports.no_import and dotted != "std":  # checked without running its code
            self.modules[alias] = (python_module_name(dotted), None, it.span)
            return
        try:
            mod = import_module(dotted, self.base_dir)
        except ImportError as exc:
            # the directory as the user named it (relative paths stay relative: messages are reproducible)
            shown = Path(self.m.path).parent if not self.m.path.startswith("<") else self.base_dir
            folder = str(shown or ".").rstrip("/") + "/"
            where = f" (searched {folder} first, then sys.path)" if self.base_dir else ""
            cause = str(exc).splitlines()[0] if str(exc) else "module not found"
            raised = exc.__cause__ is not None and not isinstance(exc.__cause__, ImportError)
            hint = ("the module was found, and its own code raised while `check` imported it (check, viz and run "
                    "import the modules a .wf names, running their code): fix the module" if raised else
                    f"put {dotted.replace('.', '/')}.py next to the .wf file or install it{where}")
            self.err(f"cannot import module '{dotted}': {cause}", Span(
                path=it.span.path, line=it.module[0].span.line, col=it.module[0].span.col,
                end_line=it.module[-1].span.end_line, end_col=it.module[-1].span.end_col), hint, "bad-import")
            mod = None
        self.modules[alias] = (python_module_name(dotted), mod, it.span)

    # Note [Tool names]: a tool result is a variable of the episode's state, read by name (`{check}`);
    # a firing replaces its value. Several transitions may each declare a tool of one name -- "a tool
    # per transition" is what users write (issue 39, item 7) -- when every declaration has the same
    # result type (a reader sees one type, whichever transition fired last); one transition declaring
    # a name twice, a different type, or a name that is also a node's stays an error.
    def _tool_name(self, i: ast.ToolItem, transition: str) -> None:
        name = i.name
        earlier = self.tool_owner.get(name.value)
        twice = (transition, name.value) in self.tool_seen
        self.tool_seen.add((transition, name.value))
        if name.value in RESERVED or name.value in self.decl_spans or twice:
            why = (f"transition '{transition}' declares tool '{name.value}' twice" if twice
                   else f"tool variable '{name.value}' clashes with another name")
            self.err(why, name.span, "give each tool result its own name (not an agent, transition or another tool "
                     "of this transition)", "duplicate-name")
            return
        call = self.resolve_call(i.call, "tool")
        t = None
        if call is not None and call[1] is not None:
            ann = return_annotation(call[1])
            t = wf_type_of(ann)
            if t is None:
                self.err(f"tool {i.call.module.value}.{i.call.function.value} has no usable return annotation",
                         i.call.span, "annotate its return type (str, int, float, bool, list[...], dict, or "
                         "Literal[\"a\", \"b\"] for a choice a route can read: distinct identifier labels)",
                         "bad-signature")
        untyped = call is None or call[1] is None  # not imported: its return type is unknown
        t = t if t is not None else TextType()
        if earlier is not None:  # declared by another transition too: one variable, one type
            before = self.tool_types[name.value]
            if not untyped and name.value not in self.untyped_tools and t != before:
                self.err(f"tool '{name.value}' returns {type_str(t)} here but {type_str(before)} in transition "
                         f"'{earlier}': one tool result has one type", name.span,
                         "give one of them another name, or make both functions return the same type",
                         "type-mismatch")
            if untyped:
                self.untyped_tools.add(name.value)
            return
        if untyped:
            self.untyped_tools.add(name.value)
        self.tool_owner[name.value] = transition
        self.tool_types[name.value] = t

    def _top_level(self, items):
        starts = [i for i in items if isinstance(i, ast.StartStmt)]
        rewards = [i for i in items if isinstance(i, ast.RewardStmt)]
        steps = [i for i in items if isinstance(i, ast.MaxStepsStmt)]
        for group, word in ((starts, "start"), (rewards, "reward"), (steps, "max_steps")):
            for extra in group[1:]:
                self.err(f"`{word}` is given twice", extra.span,
                         f"keep one `{word}:` (the first is on line {group[0].span.line}) and delete this one",
                         "duplicate-name")
        start: tuple[str, ...] = ()
        if not starts:
            self.err("the workflow has no `start`", self.m.header.span, "add `start: AGENT, ...`", "missing-start")
        else:
            names, seen = [], {}
            for n in starts[0].agents:
                if n.value not in self.agent_types:
                    self.err(f"start names unknown agent '{n.value}'", n.span,
                             close_names(n.value, self.agent_types), "unknown-name")
                elif self.unique(n, seen, "start agent"):
                    names.append(n.value)
            start = tuple(names)
        reward = None
        if rewards:
            reward = self.reward(rewards[0].call, self.uses.terminal_refs)
        max_steps = 32
        if steps:
            if not 1 <= steps[0].value.value <= MAX_COUNT:
                self.err(f"`max_steps` must be in [1, {MAX_COUNT}]", steps[0].value.span,
                         "the most transition firings per episode, e.g. `max_steps: 8` (default 32)", "bad-value")
            else:
                max_steps = int(steps[0].value.value)
        return start, reward, max_steps


__all__ = ["check", "check_module", "CheckResult", "close_names", "Uses", "DEFAULT_EXTRACTORS", "RESERVED"]
