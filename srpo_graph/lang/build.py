"""Turn Lark's parse tree into the syntax tree of :mod:`srpo_graph.lang.ast`.

Stage: lang (parse). Consumes the tree :func:`srpo_graph.lang.parser.parse` gets from Lark,
produces an :class:`~srpo_graph.lang.ast.Module`: one frozen node per grammar rule, each with
its :class:`~srpo_graph.errors.Span`. Builds nodes and nothing else: no name is resolved and
nothing is checked here, except what the text itself must satisfy (string escapes and
template holes, decoded by :mod:`srpo_graph.lang.templates`).
"""

from __future__ import annotations

from lark import Token, Transformer, v_args

from srpo_graph.errors import Diagnostic, Span, WorkflowSyntaxError
from srpo_graph.lang import ast
from srpo_graph.lang.templates import decode_string, split_template


def tok_span(tok: Token, path: str) -> Span:
    """The span of one token."""
    return Span(path=path, line=tok.line, col=tok.column, end_line=tok.end_line, end_col=tok.end_column)


class BuildAst(Transformer):
    """Lark tree -> AST nodes. Builds nodes and nothing else (no names resolved, no checks).

    A literal that cannot be decoded (a bad escape, template or number) is collected in
    ``problems`` and built as a placeholder, so every such literal of a file is reported at
    once (``parser.parse`` raises them together)."""

    def __init__(self, path: str, source: str, comments: tuple[ast.Comment, ...]):
        super().__init__()
        self.path, self.source, self.comments = path, source, comments
        self.problems: list[Diagnostic] = []

    def _decoded(self, decode, fallback):
        try:
            return decode()
        except WorkflowSyntaxError as exc:
            self.problems.extend(exc.diagnostics)
            return fallback

    def _span(self, meta) -> Span:
        if getattr(meta, "empty", True):
            return Span(path=self.path, line=1, col=1, end_line=1, end_col=1)
        return Span(path=self.path, line=meta.line, col=meta.column, end_line=meta.end_line, end_col=meta.end_column)

    def _name(self, tok: Token) -> ast.Name:
        return ast.Name(str(tok), tok_span(tok, self.path))

    def _string(self, tok: Token) -> ast.StringLit:
        span = tok_span(tok, self.path)
        triple = tok.value.startswith('"""')
        raw = tok.value[3:-3] if triple else tok.value[1:-1]
        return ast.StringLit(self._decoded(lambda: decode_string(raw, span, triple), raw), span)

    # -- module ----------------------------------------------------------------
    @v_args(meta=True)
    def start(self, meta, children):
        header, *items = children
        return ast.Module(header, tuple(items), self.comments, self.source, self._span(meta))

    @v_args(meta=True)
    def header(self, meta, children):
        name, desc = children
        return ast.Header(self._name(name), self._string(desc) if desc is not None else None, self._span(meta))

    @v_args(meta=True)
    def import_stmt(self, meta, children):
        dotted, alias = children
        return ast.ImportStmt(dotted, self._name(alias) if alias is not None else None, self._span(meta))

    def dotted_name(self, children):
        return tuple(self._name(t) for t in children)

    @v_args(meta=True)
    def task_block(self, meta, children):
        return ast.TaskBlock(tuple(children), self._span(meta))

    @v_args(meta=True)
    def field_decl(self, meta, children):
        return ast.FieldDecl(self._name(children[0]), children[1], self._span(meta))

    @v_args(meta=True)
    def policy_decl(self, meta, children):
        model = children[1] if isinstance(children[1], (ast.LoraExpr, ast.OpenaiExpr)) else self._string(children[1])
        frozen = tok_span(children[2], self.path) if len(children) > 2 and children[2] is not None else None
        return ast.PolicyDecl(self._name(children[0]), model, self._span(meta), frozen)

    @v_args(meta=True)
    def openai_expr(self, meta, children):
        return ast.OpenaiExpr(self._string(children[0]), tuple(children[1:]), self._span(meta))

    @v_args(meta=True)
    def openai_arg(self, meta, children):
        v = children[1]
        return ast.OpenaiArg(self._name(children[0]), v if isinstance(v, ast.NumberLit) else self._string(v),
                             self._span(meta))

    @v_args(meta=True)
    def lora_expr(self, meta, children):
        return ast.LoraExpr(self._string(children[0]), tuple(children[1:]), self._span(meta))

    @v_args(meta=True)
    def lora_arg(self, meta, children):
        return ast.LoraArg(self._name(children[0]), children[1], self._span(meta))

    @v_args(meta=True)
    def module_list(self, meta, children):
        return ast.ModuleList(tuple(self._name(t) for t in children if t is not None), self._span(meta))

    # -- agents ----------------------------------------------------------------
    @v_args(meta=True)
    def agent_decl(self, meta, children):
        return ast.AgentDecl(self._name(children[0]), tuple(children[1:]), self._span(meta))

    @v_args(meta=True)
    def policy_item(self, meta, children):
        return ast.PolicyItem(self._name(children[0]), self._span(meta))

    @v_args(meta=True)
    def prompt_item(self, meta, children):
        return ast.PromptItem(self._template(children[0]), self._span(meta))

    def _template(self, tok):
        span = tok_span(tok, self.path)
        triple = tok.value.startswith('"""')
        raw = tok.value[3:-3] if triple else tok.value[1:-1]
        parts = self._decoded(lambda: split_template(raw, span, triple), ())
        return ast.Template(parts, triple, span)

    @v_args(meta=True)
    def system_item(self, meta, children):
        return ast.SystemItem(self._template(children[0]), self._span(meta))

    @v_args(meta=True)
    def memory_item(self, meta, children):
        return ast.MemoryItem(self._name(children[0]), self._span(meta))

    @v_args(meta=True)
    def think_item(self, meta, children):
        return ast.ThinkItem(self._name(children[0]), self._span(meta))

    @v_args(meta=True)
    def sample_item(self, meta, children):
        return ast.SampleItem(tuple(children), self._span(meta))

    @v_args(meta=True)
    def sample_entry(self, meta, children):
        return ast.SampleEntry(self._name(children[0]), children[1], self._span(meta))

    @v_args(meta=True)
    def output_item(self, meta, children):
        return ast.OutputItem(children[0], children[1], self._span(meta))

    @v_args(meta=True)
    def unconsumed_item(self, meta, children):
        return ast.UnconsumedItem(self._name(children[0]), self._span(meta))

    # -- transitions ------------------------------------------------------------
    @v_args(meta=True)
    def transition_decl(self, meta, children):
        return ast.TransitionDecl(self._name(children[0]), tuple(children[1:]), self._span(meta))

    @v_args(meta=True)
    def consume_item(self, meta, children):
        return ast.ConsumeItem(children[0], self._span(meta))

    @v_args(meta=True)
    def tool_item(self, meta, children):
        return ast.ToolItem(self._name(children[0]), children[1], self._span(meta))

    @v_args(meta=True)
    def reward_item(self, meta, children):
        return ast.RewardItem(children[0], self._span(meta))

    @v_args(meta=True)
    def activate_item(self, meta, children):
        return ast.ActivateItem(children[0], self._span(meta))

    @v_args(meta=True)
    def max_rounds_item(self, meta, children):
        value = ast.NumberLit(number_value(children[0], self.path), tok_span(children[0], self.path))
        return ast.MaxRoundsItem(value, self._span(meta))

    @v_args(meta=True)
    def activate_end(self, meta, children):
        return ast.ActivateEnd(self._span(meta))

    @v_args(meta=True)
    def activate_agents(self, meta, children):
        return ast.ActivateAgents(children[0], self._span(meta))

    @v_args(meta=True)
    def activate_route(self, meta, children):
        return ast.ActivateRoute(children[0], children[1], self._span(meta))

    def route_cases(self, children):
        return tuple(children)

    @v_args(meta=True)
    def route_case(self, meta, children):
        tok = children[0]
        label = tok.value[:-2].rstrip()
        span = Span(path=self.path, line=tok.line, col=tok.column, end_line=tok.line, end_col=tok.column + len(label))
        return ast.RouteCase(ast.Name(label, span), tuple(children[1:]), self._span(meta))

    def target(self, children):
        return self._name(children[0])

    # -- workflow-level ---------------------------------------------------------
    @v_args(meta=True)
    def start_stmt(self, meta, children):
        return ast.StartStmt(children[0], self._span(meta))

    @v_args(meta=True)
    def reward_stmt(self, meta, children):
        return ast.RewardStmt(children[0], self._span(meta))

    @v_args(meta=True)
    def max_steps_stmt(self, meta, children):
        return ast.MaxStepsStmt(
            ast.NumberLit(number_value(children[0], self.path), tok_span(children[0], self.path)), self._span(meta)
        )

    def name_list(self, children):
        return tuple(self._name(t) for t in children)

    # -- types -------------------------------------------------------------------
    @v_args(meta=True)
    def text_type(self, meta, _):
        return ast.SimpleType("text", self._span(meta))

    @v_args(meta=True)
    def int_type(self, meta, _):
        return ast.SimpleType("int", self._span(meta))

    @v_args(meta=True)
    def float_type(self, meta, _):
        return ast.SimpleType("float", self._span(meta))

    @v_args(meta=True)
    def bool_type(self, meta, _):
        return ast.SimpleType("bool", self._span(meta))

    @v_args(meta=True)
    def choice_type(self, meta, children):
        return ast.ChoiceTypeExpr(children[0], False, self._span(meta))

    @v_args(meta=True)
    def choices_type(self, meta, children):
        return ast.ChoiceTypeExpr(children[0], True, self._span(meta))

    @v_args(meta=True)
    def list_type(self, meta, children):
        return ast.ListTypeExpr(children[0], self._span(meta))

    @v_args(meta=True)
    def record_type(self, meta, children):
        return ast.RecordTypeExpr(tuple(children), self._span(meta))

    @v_args(meta=True)
    def record_field(self, meta, children):
        return ast.RecordField(self._name(children[0]), children[1], self._span(meta))

    def label_list(self, children):
        return tuple(children)

    # -- calls and values ----------------------------------------------------------
    @v_args(meta=True)
    def call(self, meta, children):
        module, function, args = children
        return ast.Call(self._name(module), self._name(function), args or (), args is not None, self._span(meta))

    def call_args(self, children):
        return tuple(c for c in children if c is not None)

    @v_args(meta=True)
    def arg(self, meta, children):
        name, value = children
        return ast.Arg(self._name(name) if name is not None else None, value, self._span(meta))

    @v_args(meta=True)
    def ref(self, meta, children):
        optional = bool(children) and children[-1].type == "OPTIONAL"
        names = children[:-1] if optional else children
        return ast.Ref(tuple(str(t) for t in names), optional, self._span(meta))

    def string(self, children):
        return self._string(children[0])

    def signed_number(self, children):
        tok = children[0]
        return ast.NumberLit(self._decoded(lambda: number_value(tok, self.path), 0), tok_span(tok, self.path))

    @v_args(meta=True)
    def true(self, meta, _):
        return ast.BoolLit(True, self._span(meta))

    @v_args(meta=True)
    def false(self, meta, _):
        return ast.BoolLit(False, self._span(meta))

    @v_args(meta=True)
    def value_list(self, meta, children):
        return ast.ListLit(tuple(c for c in children if c is not None), self._span(meta))


MAX_INT_DIGITS = 18  # an integer literal fits int64 (and every count the runtime keeps)


def number_value(tok: Token, path: str) -> int | float:
    """The value of a number token, exactly as written, or a ``bad-number`` error: a float that
    overflows to inf or underflows to 0 would silently become another number (and print as
    ``inf``, which is no number of the language), an integer beyond int64 reaches no counter.
    """
    text = tok.value
    is_float = any(c in text for c in ".eE")
    digits = text.lstrip("+-")
    problem = None
    if is_float:
        value: int | float = float(text)
        mantissa = digits.split("e")[0].split("E")[0]
        if value in (float("inf"), float("-inf")):
            problem = f"number {text} is too large for a float (it would become inf)"
        elif value == 0 and any(c in "123456789" for c in mantissa):
            problem = f"number {text} is too small for a float (it would become 0)"
    elif len(digits.lstrip("0")) > MAX_INT_DIGITS:
        value, problem = (
            0,
            f"integer {text[:24]}{'...' if len(text) > 24 else ''} has more than {MAX_INT_DIGITS} digits",
        )
    else:
        value = int(text)
    if problem is not None:
        raise WorkflowSyntaxError(
            diagnostics=[
                Diagnostic(
                    problem, tok_span(tok, path), "write a number in range, e.g. 1e6 or 0.001", code="bad-number"
                )
            ]
        )
    return value
