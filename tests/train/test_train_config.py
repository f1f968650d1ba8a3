"""TrainConfig: TOML + overrides, validation errors that name the field, round trip."""

import pytest

from srpo_graph.errors import ConfigError
from srpo_graph.train.config.loading import TrainConfig, apply_overrides, load_config, load_toml, validate, write_config


def test_defaults_and_overrides_are_typed():
    cfg = load_config(None, ["steps=7", "optim.lr=2e-3", "rollout.backend=sglang", "logging.tensorboard=false",
                             "optim.betas=[0.8, 0.9]", 'rollout.models={tiny="tiny"}'])
    assert cfg.steps == 7 and cfg.optim.lr == 2e-3 and cfg.rollout.backend == "sglang"
    assert cfg.logging.tensorboard is False and cfg.optim.betas == (0.8, 0.9)
    assert cfg.rollout.models == {"tiny": "tiny"}
    assert TrainConfig().loss.alpha == 0.5  # the objective's defaults are embedded


def test_toml_file_then_overrides_win(tmp_path):
    p = tmp_path / "train.toml"
    p.write_text('steps = 3\n[optim]\nlr = 0.01\nepochs = 4\n[loss]\neps_high = 0.28\n')
    cfg = load_config(p, ["optim.lr=0.02"])
    assert (cfg.steps, cfg.optim.lr, cfg.optim.epochs, cfg.loss.eps_high) == (3, 0.02, 4, 0.28)


def test_resolved_config_round_trips(tmp_path):
    cfg = load_config(
        None, ["steps=9", "run_dir=runs/x", "debug.nonfinite_at_steps=[2]", "compile.micro_batch_tokens=128"]
    )
    write_config(cfg, tmp_path / "config.toml")
    again = validate(load_toml(tmp_path / "config.toml"))
    assert again == cfg


@pytest.mark.parametrize(
    "overrides, field, words",
    [
        (["optim.lrr=1"], "optim.lrr", "unknown field"),
        (["nonsense=1"], "nonsense", "unknown field"),
        (["optim.lr=-1"], "optim.lr", "greater than 0"),
        (["rollout.samples=0"], "rollout.samples", "greater than or equal to 1"),
        (["rollout.backend=vllm"], "rollout.backend", "transformers"),
        (["loss.alpha=5"], "loss.alpha", "less than or equal to 2"),
        (["optim.betas=[0.9, 1.5]"], "optim.betas", "[0, 1)"),
        (["eval.mode=beam"], "eval.mode", "greedy"),
    ],
)
def test_invalid_values_name_the_field_with_a_fix(overrides, field, words):
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides)
    msg = str(info.value)
    assert f"`{field}`" in msg and words in msg and "fix:" in msg
    assert "ValidationError" not in msg and "pydantic" not in msg


def test_bad_toml_reports_line_and_file(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text("steps = 3\n[optim\nlr = 1\n")
    with pytest.raises(ConfigError) as info:
        load_config(p)
    assert str(p) in str(info.value) and "line 2" in str(info.value)


def test_bad_override_syntax_and_section_clash():
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        load_config(None, ["steps"])
    with pytest.raises(ConfigError, match="not a section"):
        load_config(None, ["steps=3", "steps.x=1"])


def test_apply_overrides_keeps_other_fields():
    cfg = apply_overrides(TrainConfig(steps=5, seed=3), ["seed=4"])
    assert (cfg.steps, cfg.seed) == (5, 4)


def test_docs_config_reference_is_current():
    # docs/training.md carries the generated field table; regenerate it when a field changes.
    from pathlib import Path

    from srpo_graph.train.config.loading import config_reference

    doc = (Path(__file__).resolve().parents[2] / "docs" / "training.md").read_text(encoding="utf-8")
    assert config_reference().strip() in doc  # regenerate: python scripts/gen_docs.py


@pytest.mark.parametrize(
    "override, suggestion",
    [
        ("optim.lrr=1", "did you mean `optim.lr`?"),
        ("optimm.lr=1", "did you mean `optim`?"),
        ("rollout.sample=4", "did you mean `rollout.samples`?"),
        ("eps_high=0.3", "did you mean `loss.eps_high`?"),  # right name, wrong section
    ],
)
def test_unknown_fields_suggest_the_nearest_known_one(override, suggestion):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert suggestion in str(err.value)


def test_unknown_field_without_a_near_name_gets_no_guess():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["zzzzzz=1"])
    assert "did you mean" not in str(err.value) and "unknown field `zzzzzz`" in str(err.value)


def test_backend_options_are_sections_and_old_flat_names_still_load(tmp_path):
    """`rollout.<backend>.<field>` (generated from backends.BACKENDS); a config.toml written before the
    sections (`sglang_url = ...`, `weight_dir`) still loads, so an older run resumes."""
    cfg = load_config(None, ["rollout.backend=sglang", "rollout.sglang.url=http://h:1", "rollout.sglang.retries=0"])
    assert cfg.rollout.sglang.url == "http://h:1" and cfg.rollout.sglang.retries == 0
    old = tmp_path / "config.toml"
    old.write_text(
        '[rollout]\nbackend = "sglang"\nsglang_url = "http://old:2"\nsglang_launch = "cpu"\n'
        'weight_dir = "/w"\nsamples = 4\n',
        encoding="utf-8",
    )
    cfg = load_config(old)
    assert (cfg.rollout.sglang.url, cfg.rollout.sglang.launch, str(cfg.rollout.sglang.weight_dir)) == (
        "http://old:2",
        "cpu",
        "/w",
    )
    assert cfg.rollout.samples == 4
    with pytest.raises(
        ConfigError, match=r"(?s)unknown field `rollout.sglang.urll`.*did you mean `rollout.sglang.url`"
    ):
        load_config(None, ["rollout.sglang.urll=x"])
    with pytest.raises(ConfigError, match="unknown backend 'vllm'; known: transformers, sglang"):
        load_config(None, ["rollout.backend=vllm"])
