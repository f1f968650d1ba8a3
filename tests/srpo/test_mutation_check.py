"""The mutation check: change each objective's definition, the advantage rule and the return
rule one at a time, and show that some test fails for every change (issue 8, item 10).

Each mutation patches the live table or rule (``OBJECTIVES``, ``compile.RETURNS``,
``advantages.normalize``) for the duration of one check and runs the tests that guard it
in-process; the check passes only if at least one of them fails. A mutation that no test
notices is a hole in the suite. Bounded: a few seconds in all.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import pytest

from srpo_graph.compiler import advantages as adv_mod
from srpo_graph.compiler import compile as compile_mod
from srpo_graph.compiler.options import ReturnMode
from srpo_graph.srpo import loss as loss_mod
from srpo_graph.srpo import objectives
from srpo_graph.srpo.options import Reduction
from tests.compiler import test_advantages, test_provenance
from tests.srpo import test_objectives_papers as papers


def _row(name: str, loss: dict | None = None, compile: dict | None = None):
    def apply(mp: pytest.MonkeyPatch) -> None:
        row = objectives.OBJECTIVES[name]
        mp.setitem(objectives.OBJECTIVES, name, dataclasses.replace(
            row, loss={**row.loss, **(loss or {})}, compile={**row.compile, **(compile or {})}))
    return apply


def _firing_order(ep, config, reward):
    """The old rule: terminal reward + rewards of this and every LATER firing, branch or not."""
    rs = [(t.step, t.reward or 0.0) for t in ep.transitions]
    terminal = reward - sum(r for _, r in rs)
    return {t.id: terminal + sum(r for s, r in rs if s >= t.step) for t in ep.transitions}


def _undiscounted(ep, config, reward):
    return compile_mod._provenance_returns(ep, config.model_copy(update={"gamma": 1.0}), reward)


def _population_std(values, group, num_groups, **kw):
    return _orig_normalize(values, group, num_groups, **{**kw, "unbiased": False})


def _no_zero_variance_rule(values, group, num_groups, **kw):
    adv, zero = _orig_normalize(values, group, num_groups, **kw)
    return adv + 0.0 * values + zero[group].double() * 0.5, zero  # zero-variance groups no longer get 0


_orig_normalize = adv_mod.normalize

MUTATIONS: dict[str, Callable[[pytest.MonkeyPatch], None]] = {
    "srpo alpha 1/2 -> 1": _row("srpo", {"alpha": 1.0}),
    "srpo unit set -> member": _row("srpo", {"ratio_unit": "member"}),
    "srpo_sum alpha 0 -> 1/2": _row("srpo_sum", {"alpha": 0.5}),
    "independent unit member -> set": _row("independent", {"ratio_unit": "set"}),
    "grpo unit token -> member": _row("grpo", {"ratio_unit": "member"}),
    "grpo reduction member_mean -> token": _row("grpo", {"reduction": "token"}),
    "grpo advantage episode -> transition": _row("grpo", compile={"advantage": "transition"}),
    "grpo_kl beta 0.04 -> 0.01": _row("grpo_kl", {"kl_coef": 0.01}),
    "dr_grpo reduction constant -> member_mean": _row("dr_grpo", {"reduction": "member_mean"}),
    "dr_grpo denominator -> longest completion": _row("dr_grpo", {"constant_denominator": 10.0}),
    "dr_grpo std on": _row("dr_grpo", compile={"use_std": True}),
    "dapo reduction token -> member_mean": _row("dapo", {"reduction": "member_mean"}),
    "dapo clip-higher 0.28 -> 0.2": _row("dapo", {"eps_high": 0.2}),
    "dapo dynamic sampling off": _row("dapo", compile={"drop_zero_variance": False}),
    "gspo unit member -> token": _row("gspo", {"ratio_unit": "token"}),
    "gspo log-ratio mean -> sum": _row("gspo", {"member_logratio": "sum"}),
    "gspo clip 3e-4/4e-4 -> 0.2": _row("gspo", {"eps_low": 0.2, "eps_high": 0.2}),
    "gmpo surrogate -> clip": _row("gmpo", {"surrogate": "clip"}),
    "gmpo clip 0.4 -> 0.2": _row("gmpo", {"eps_low": 0.2, "eps_high": 0.2}),
    "cispo surrogate -> clip": _row("cispo", {"surrogate": "clip"}),
    "cispo reduction token -> member_mean": _row("cispo", {"reduction": "member_mean"}),
    "dr_mas advantage agent -> transition": _row("dr_mas", compile={"advantage": "transition"}),
    "dr_mas trajectory reward -> provenance returns": _row("dr_mas", compile={"returns": "provenance"}),
    "dr_grpo denominator -> sum of each output's budget": lambda mp: mp.setitem(
        loss_mod.DENOMINATORS, Reduction.CONSTANT, lambda b, cfg: float(b.member_max_tokens.sum())),
    "return rule provenance -> firing order": lambda mp: mp.setitem(compile_mod.RETURNS, ReturnMode.PROVENANCE,
                                                                    _firing_order),
    "return rule discount ignored": lambda mp: mp.setitem(compile_mod.RETURNS, ReturnMode.PROVENANCE, _undiscounted),
    "advantage rule sample std -> population std": lambda mp: mp.setattr(adv_mod, "normalize", _population_std),
    "advantage rule zero-variance groups not zero": lambda mp: mp.setattr(adv_mod, "normalize",
                                                                           _no_zero_variance_rule),
}


def _guards() -> list[Callable[[], None]]:
    """The tests that guard the objectives, the advantage rule and the return rule."""
    checks: list[Callable[[], None]] = [lambda n=n: papers.test_objective_matches_its_paper(n) for n in papers.PAPERS]
    checks += [lambda g=g: test_advantages.test_compiled_advantages_match_a_loop_over_episodes(m, g)
               for m in test_advantages.AdvantageMode for g in (1.0, 0.5)]
    checks += [test_provenance.test_loop_returns_are_discounted_per_hop,
               test_advantages.test_zero_variance_groups_are_counted_and_can_be_dropped]
    return checks


def _failures() -> int:
    failed = 0
    for check in _guards():
        try:
            check()
        except AssertionError:
            failed += 1
    return failed


def test_the_guards_pass_unmutated():
    assert _failures() == 0


@pytest.mark.parametrize("name", list(MUTATIONS))
def test_every_mutation_is_caught(name, monkeypatch):
    MUTATIONS[name](monkeypatch)
    assert _failures() > 0, f"mutation {name!r} passed every test: the suite has a hole"
