"""Plan validation: shipped scenarios load, bad input gives one ``field.path: ...`` line
per problem, overrides, ``extends:`` and model presets."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from rollart.plan import Plan, PlanError, apply_overrides, load_plan, plan_from_dict, read_yaml
from rollart.plan.loader import deep_merge, parse_override
from rollart.plan.presets import GPU_PRESETS, MODEL_PRESETS
from rollart.plan.schema import ModelSpec
from rollart.scenarios_catalog import default_scenario

SCENARIOS_DIR = Path(__file__).resolve().parents[1] / "scenarios"
SCENARIO_FILES = sorted(SCENARIOS_DIR.rglob("*.yaml"))


def problems_of(overrides: list[str], path: Path | None = None) -> list[str]:
    """Load the default scenario (or ``path``) with ``overrides``; return the PlanError lines."""
    with pytest.raises(PlanError) as info:
        load_plan(path or default_scenario(), overrides)
    problems = info.value.problems
    assert problems, "a PlanError must carry at least one problem line"
    assert str(info.value) == "\n".join(problems)
    return problems


def only_line(problems: list[str], prefix: str) -> str:
    """The single problem line that starts with ``prefix``."""
    matching = [p for p in problems if p.startswith(prefix)]
    assert len(matching) == 1, f"expected one line starting with {prefix!r}, got {problems}"
    return matching[0]


@pytest.fixture(scope="module")
def default_data() -> dict:
    return read_yaml(default_scenario())


# ---------------------------------------------------------------- shipped scenarios load


def test_scenarios_dir_has_default_and_paper_scenarios():
    names = {p.relative_to(SCENARIOS_DIR).as_posix() for p in SCENARIO_FILES}
    assert "default.yaml" in names
    assert {"paper/qwen3-8b-128gpu.yaml", "paper/qwen3-14b-128gpu.yaml", "paper/qwen3-32b-128gpu.yaml"} <= names


def test_default_scenario_loads():
    plan = load_plan(default_scenario())
    assert isinstance(plan, Plan)
    assert plan.name == "default"
    assert plan.model.name == "Qwen3-8B"
    assert [t.name for t in plan.tasks] == ["FrozenLake", "GEM-Math", "CodeExec"]
    assert set(plan.cluster.gpu_pools) == {"h800", "h20"}
    assert plan.algorithm.batch_size == 64 and plan.algorithm.group_size == 8
    assert plan.groups_per_batch == 8
    assert plan.algorithm.mode == "rollart"


@pytest.mark.parametrize("path", SCENARIO_FILES, ids=lambda p: p.relative_to(SCENARIOS_DIR).as_posix())
def test_every_shipped_scenario_loads(path: Path):
    plan = load_plan(path)
    assert isinstance(plan, Plan)
    raw = yaml.safe_load(path.read_text())
    assert plan.name == raw.get("name", path.stem)
    assert plan.tasks and plan.placement.generation
    # Every GPU pool resolves to a known type and stays within its budget.
    for name, pool in plan.cluster.gpu_pools.items():
        assert plan.gpu_of_pool(name).tflops_bf16 > 0
        assert pool.count > 0


def test_extends_scenarios_inherit_from_parent():
    base = load_plan(SCENARIOS_DIR / "paper" / "qwen3-8b-128gpu.yaml")
    child = load_plan(SCENARIOS_DIR / "paper" / "qwen3-32b-128gpu.yaml")
    assert child.model.name == "Qwen3-32B"
    assert child.name == "qwen3-32b-128gpu"
    # Restated (a list replaces the parent's): the base's tasks plus SWE, which the paper runs with 32B only.
    assert [t.name for t in child.tasks] == ["SWE", *(t.name for t in base.tasks)]
    # Not restated in the child: inherited from qwen3-8b-128gpu.yaml.
    assert child.cluster == base.cluster
    assert child.algorithm == base.algorithm
    # Restated: the child's placement wins.
    assert child.placement.trainer.tp == 8
    assert [(g.pool, g.workers, g.tp) for g in child.placement.generation] == [("h800", 8, 4), ("h20", 8, 4)]


# ---------------------------------------------------------------- bad input → field-path lines


def test_negative_batch_size():
    problems = problems_of(["algorithm.batch_size=-4"])
    line = only_line(problems, "algorithm.batch_size:")
    assert "greater than 0" in line
    assert "-4" in line


def test_unknown_gpu_type_names_path_and_known_types():
    problems = problems_of(["cluster.gpu_pools.h20.gpu=H900"])
    line = only_line(problems, "cluster.gpu_pools.h20.gpu:")
    assert "'H900'" in line
    for known in GPU_PRESETS:
        assert known in line


def test_gpu_type_is_case_insensitive():
    plan = load_plan(default_scenario(), ["cluster.gpu_pools.h20.gpu=h20"])
    assert plan.gpu_of_pool("h20").tflops_bf16 == GPU_PRESETS["H20"]["tflops_bf16"]


def test_custom_gpu_type_is_accepted():
    plan = load_plan(default_scenario(), [
        "cluster.custom_gpus.H900={tflops_bf16: 2000, hbm_tbps: 8, memory_gb: 192}",
        "cluster.gpu_pools.h20.gpu=H900",
    ])
    assert plan.gpu_of_pool("h20").tflops_bf16 == 2000
    assert plan.gpu_of_pool("h20").nvlink_gbps == 400.0  # the GpuType default


def test_hw_affinity_unknown_pool_exact_message():
    problems = problems_of(["placement.hw_affinity.FrozenLake=H900"])
    assert problems == ["placement.hw_affinity.FrozenLake: unknown pool 'H900'; pools are: h800, h20"]


def test_hw_affinity_unknown_tag():
    problems = problems_of(["placement.hw_affinity.NoSuchTag=h20"])
    line = only_line(problems, "placement.hw_affinity.NoSuchTag:")
    assert "no task has this tag" in line
    assert "FrozenLake" in line and "default" in line


def test_unknown_field():
    problems = problems_of(["algorithm.mod=sync"])
    assert len(problems) == 1
    assert problems[0].startswith("algorithm.mod:")
    assert "unknown field" in problems[0]


def test_negative_distribution_parameter():
    problems = problems_of(["tasks.FrozenLake.env.reset.sigma=-1"])
    # FrozenLake is tasks[0]; the path names the distribution's field.
    line = only_line(problems, "tasks.FrozenLake.env.reset.sigma:")
    assert "greater than or equal to 0" in line
    assert "-1" in line
    # pydantic's union discriminator tag must not leak into the path.
    assert "lognormal" not in line.split(":")[0]


def test_gpu_oversubscription_of_a_pool():
    problems = problems_of(["placement.trainer.gpus=64"])
    line = only_line(problems, "cluster.gpu_pools.h800.count:")
    # trainer 64 + generation 2 workers × tp 2 = 68 of 8 GPUs
    assert "68" in line and "8" in line


def test_gpu_oversubscription_counts_workers_times_tp():
    # 8 workers × tp 2 = 16 > 8 H20s
    problems = problems_of(["placement.generation.1.tp=2"])
    line = only_line(problems, "cluster.gpu_pools.h20.count:")
    assert "16" in line


def test_batch_size_not_multiple_of_group_size():
    problems = problems_of(["algorithm.batch_size=60"])
    line = only_line(problems, "algorithm.batch_size:")
    assert "60" in line and "group_size" in line and "(8)" in line


def test_unknown_model_preset():
    problems = problems_of(["model=Qwen9-1B"])
    line = only_line(problems, "model:")
    assert "Qwen9-1B" in line
    for preset in MODEL_PRESETS:
        assert preset in line


def test_weight_sync_link_missing():
    problems = problems_of(["weight_sync.link=infiniband_9000"])
    line = only_line(problems, "weight_sync.link:")
    assert "infiniband_9000" in line
    assert "cross_cluster" in line and "intra_cluster" in line


def test_failure_prob_above_one():
    problems = problems_of(["tasks.FrozenLake.env.failure_prob=1.5"])
    line = only_line(problems, "tasks.FrozenLake.env.failure_prob:")
    assert "less than or equal to 1" in line


def test_empirical_without_probability_zero_and_one():
    problems = problems_of(["tasks.GEM-Math.env.reset={kind: empirical, quantiles: {0.5: 1, 1: 2}}"])
    line = only_line(problems, "tasks.GEM-Math.env.reset.quantiles:")
    assert "0 and 1" in line


def test_empirical_decreasing_values_rejected():
    problems = problems_of(["tasks.0.env.step={kind: empirical, quantiles: {0: 2, 1: 1}}"])
    line = only_line(problems, "tasks.FrozenLake.env.step.quantiles:")
    assert "must not decrease" in line


def test_uniform_high_below_low_rejected():
    problems = problems_of(["tasks.0.turns={kind: uniform, low: 5, high: 2}"])
    line = only_line(problems, "tasks.FrozenLake.turns:")
    assert "high" in line and "low" in line


def test_turns_with_infinite_mean_rejected():
    problems = problems_of(["tasks.0.turns={kind: pareto, scale: 5, shape: 0.5}"])
    line = only_line(problems, "tasks.FrozenLake.turns:")
    assert "finite mean" in line


def test_several_problems_are_all_reported():
    problems = problems_of(["cluster.gpu_pools.h20.gpu=H900", "weight_sync.link=nope", "algorithm.batch_size=60"])
    only_line(problems, "cluster.gpu_pools.h20.gpu:")
    only_line(problems, "weight_sync.link:")
    only_line(problems, "algorithm.batch_size:")


def test_set_without_equals():
    with pytest.raises(PlanError) as info:
        load_plan(default_scenario(), ["algorithm.batch_size"])
    assert len(info.value.problems) == 1
    line = info.value.problems[0]
    assert line.startswith("--set algorithm.batch_size:")
    assert "KEY=VALUE" in line


def test_set_empty_key():
    with pytest.raises(PlanError) as info:
        parse_override("=3")
    assert "empty key" in info.value.problems[0]


def test_set_through_missing_list_item_by_name():
    with pytest.raises(PlanError) as info:
        load_plan(default_scenario(), ["tasks.NoSuchTask.share=1"])
    assert info.value.problems == ["--set tasks.NoSuchTask.share: no item 'NoSuchTask' at tasks.NoSuchTask; "
                                   "tasks are: FrozenLake, GEM-Math, CodeExec"]


def test_set_through_missing_list_item_by_index():
    with pytest.raises(PlanError) as info:
        load_plan(default_scenario(), ["tasks.7.share=1"])
    assert len(info.value.problems) == 1
    assert "no item '7'" in info.value.problems[0]


def test_set_through_a_scalar_names_the_field():
    problems = problems_of(["algorithm.seed.x=1"])
    assert problems == ["--set algorithm.seed.x: algorithm.seed is a value (0), not a section"], problems


def test_missing_scenario_file(tmp_path: Path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(PlanError) as info:
        load_plan(missing)
    assert info.value.problems == [f"{missing}: no such scenario file"]


def test_invalid_yaml_names_the_line(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ncluster: [unclosed\n")
    with pytest.raises(PlanError) as info:
        load_plan(bad)
    assert len(info.value.problems) == 1
    assert "not valid YAML" in info.value.problems[0]
    assert "(line " in info.value.problems[0]


def test_yaml_that_is_not_a_mapping(tmp_path: Path):
    bad = tmp_path / "list.yaml"
    bad.write_text("- 1\n- 2\n")
    with pytest.raises(PlanError) as info:
        load_plan(bad)
    assert "a scenario is a YAML mapping" in info.value.problems[0]


def test_missing_required_field(default_data: dict):
    data = copy.deepcopy(default_data)
    del data["algorithm"]["batch_size"]
    with pytest.raises(PlanError) as info:
        plan_from_dict(data)
    assert info.value.problems == ["algorithm.batch_size: required field is missing"]


def test_user_key_named_like_a_union_tag_keeps_its_path():
    problems = problems_of(["cluster.cpu_pools.uniform={cores: -1}", "tasks.0.env.pool=uniform"])
    assert any(p.startswith("cluster.cpu_pools.uniform.cores:") for p in problems), problems


# ---------------------------------------------------------------- apply_overrides


def test_overrides_address_list_items_by_index_and_name(default_data: dict):
    out = apply_overrides(default_data, ["tasks.0.share=0.7", "tasks.GEM-Math.share=0.1", "tasks.-1.turns=3"])
    assert out["tasks"][0]["share"] == 0.7
    assert out["tasks"][1]["share"] == 0.1
    assert out["tasks"][2]["turns"] == 3
    assert out["tasks"][2]["name"] == "CodeExec"


def test_overrides_accept_bracketed_list_items(default_data: dict):
    """``tasks[0].share`` and ``tasks[GEM-Math].share`` mean ``tasks.0.share`` and ``tasks.GEM-Math.share``."""
    out = apply_overrides(default_data, ["tasks[0].share=0.7", "tasks[GEM-Math].share=0.1", "tasks[-1].turns=3"])
    assert (out["tasks"][0]["share"], out["tasks"][1]["share"], out["tasks"][2]["turns"]) == (0.7, 0.1, 3)
    with pytest.raises(PlanError, match=r"^--set tasks\.7\.share: no item '7' at tasks\.7; tasks are: FrozenLake"):
        apply_overrides(default_data, ["tasks[7].share=0.1"])


def test_overrides_address_list_item_fields_in_the_plan():
    plan = load_plan(default_scenario(), ["placement.generation.1.workers=4", "tasks.CodeExec.env.timeout_s=30"])
    assert plan.placement.generation[1].workers == 4
    assert plan.task("CodeExec").env.timeout_s == 30.0


def test_overrides_parse_yaml_values(default_data: dict):
    out = apply_overrides(default_data, [
        "algorithm.alpha=2",
        "algorithm.redundancy=0.5",
        "placement.pd_disaggregation=true",
        "placement.prefix_cache=no",
        "cluster.gpu_pools.h20={gpu: H20, count: 16}",
        "tasks.0.env.step={kind: constant, value: 0.001}",
        "description=hello world",
        "model='Qwen3-14B'",
    ])
    assert out["algorithm"]["alpha"] == 2 and type(out["algorithm"]["alpha"]) is int
    assert out["algorithm"]["redundancy"] == 0.5 and type(out["algorithm"]["redundancy"]) is float
    assert out["placement"]["pd_disaggregation"] is True
    assert out["placement"]["prefix_cache"] is False  # YAML 1.1 'no'
    assert out["cluster"]["gpu_pools"]["h20"] == {"gpu": "H20", "count": 16}
    assert out["tasks"][0]["env"]["step"] == {"kind": "constant", "value": 0.001}
    assert out["description"] == "hello world"
    assert out["model"] == "Qwen3-14B"


def test_overrides_create_missing_sections(default_data: dict):
    out = apply_overrides(default_data, ["cluster.custom_gpus.X={tflops_bf16: 1, hbm_tbps: 1, memory_gb: 1}"])
    assert out["cluster"]["custom_gpus"] == {"X": {"tflops_bf16": 1, "hbm_tbps": 1, "memory_gb": 1}}


def test_override_value_may_contain_equals(default_data: dict):
    out = apply_overrides(default_data, ["description=a=b"])
    assert out["description"] == "a=b"


def test_overrides_do_not_mutate_input(default_data: dict):
    before = copy.deepcopy(default_data)
    out = apply_overrides(default_data, ["algorithm.alpha=3", "tasks.FrozenLake.share=0.9",
                                         "tasks.0.env.reset.sigma=0.1", "cluster.gpu_pools.h20.count=4"])
    assert default_data == before
    assert out is not default_data
    assert out["algorithm"]["alpha"] == 3 and default_data["algorithm"]["alpha"] == 1
    assert out["tasks"][0]["env"]["reset"]["sigma"] == 0.1
    assert default_data["tasks"][0]["env"]["reset"]["sigma"] == 0.5


def test_later_overrides_win(default_data: dict):
    out = apply_overrides(default_data, ["algorithm.alpha=2", "algorithm.alpha=5"])
    assert out["algorithm"]["alpha"] == 5


def test_override_a_field_of_a_preset_shorthand_model():
    plan = load_plan(default_scenario(), ["model.layers=40"])
    assert plan.model.layers == 40
    assert plan.model.hidden == MODEL_PRESETS["Qwen3-8B"]["hidden"]


# ---------------------------------------------------------------- extends


def _write(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_deep_merge_merges_mappings_and_replaces_lists():
    base = {"a": {"x": 1, "y": {"p": 1, "q": 2}}, "l": [1, 2, 3], "s": "base"}
    top = {"a": {"y": {"q": 20, "r": 30}}, "l": [9], "t": True}
    out = deep_merge(base, top)
    assert out == {"a": {"x": 1, "y": {"p": 1, "q": 20, "r": 30}}, "l": [9], "s": "base", "t": True}
    assert base == {"a": {"x": 1, "y": {"p": 1, "q": 2}}, "l": [1, 2, 3], "s": "base"}


def test_extends_merges_mappings_and_replaces_lists(tmp_path: Path, default_data: dict):
    parent = dict(default_data)
    parent.pop("name")
    _write(tmp_path / "base.yaml", parent)
    child = _write(tmp_path / "child.yaml", {
        "extends": "base.yaml",
        "name": "child",
        "cluster": {"gpu_pools": {"h20": {"gpu": "H20", "count": 16}}},
        "algorithm": {"alpha": 3},
        "placement": {"generation": [{"pool": "h20", "workers": 16}, {"pool": "h800", "workers": 1}]},
    })
    plan = load_plan(child)
    assert plan.name == "child"
    # mappings merge key by key: h800 survives, h20 is replaced by the child's values
    assert set(plan.cluster.gpu_pools) == {"h800", "h20"}
    assert plan.cluster.gpu_pools["h20"].count == 16
    assert plan.cluster.gpu_pools["h800"].count == 8
    assert plan.algorithm.alpha == 3
    assert plan.algorithm.batch_size == 64  # inherited sibling key
    assert plan.placement.trainer.gpus == 4  # inherited sibling of the replaced list
    # lists are replaced, not merged
    # (merged by index, item 0 would keep the parent's tp 2 and item 1 its 8 workers)
    assert [(g.pool, g.workers, g.tp) for g in plan.placement.generation] == [("h20", 16, 1), ("h800", 1, 1)]
    assert len(plan.tasks) == 3


def test_extends_chain_of_three(tmp_path: Path, default_data: dict):
    _write(tmp_path / "a.yaml", default_data)
    (tmp_path / "sub").mkdir()
    _write(tmp_path / "sub" / "b.yaml", {"extends": "../a.yaml", "algorithm": {"alpha": 2}})
    c = _write(tmp_path / "sub" / "c.yaml", {"extends": "b.yaml", "algorithm": {"seed": 7}})
    plan = load_plan(c)
    assert plan.algorithm.alpha == 2
    assert plan.algorithm.seed == 7
    assert plan.algorithm.steps == 6


def test_deep_merge_null_removes_the_key():
    base = {"a": {"x": 1, "y": {"p": 1, "q": 2}}, "s": "base", "t": 1}
    out = deep_merge(base, {"a": {"y": {"q": None}}, "s": None, "absent": None, "new": {"k": None, "v": 1}})
    assert out == {"a": {"x": 1, "y": {"p": 1}}, "t": 1, "new": {"v": 1}}
    assert base == {"a": {"x": 1, "y": {"p": 1, "q": 2}}, "s": "base", "t": 1}


def test_extends_null_deletes_inherited_keys(tmp_path: Path, default_data: dict):
    parent = dict(default_data)
    parent.pop("name")
    parent["weight_sync"] = {**parent.get("weight_sync", {}), "bucket_mb": 256}
    _write(tmp_path / "base.yaml", parent)
    child = tmp_path / "child.yaml"
    # a bare key, ~ and null all mean "remove what the parent set"
    child.write_text("extends: base.yaml\n"
                     "placement:\n  hw_affinity: {CodeExec: null, default: ~}\n"
                     "weight_sync:\n  bucket_mb:\n")
    data = read_yaml(child)
    assert data["placement"]["hw_affinity"] == {"FrozenLake": "h800"}
    assert "bucket_mb" not in data["weight_sync"]
    plan = load_plan(child)
    assert plan.placement.hw_affinity == {"FrozenLake": "h800"}
    assert plan.weight_sync.bucket_mb == 1024.0  # back to the schema default
    # a whole section can go, and the grandchild of a deleting child does not see the key either
    _write(tmp_path / "grand.yaml", {"extends": "child.yaml", "placement": {"hw_affinity": None}})
    assert load_plan(tmp_path / "grand.yaml").placement.hw_affinity == {}


def test_extends_cycle(tmp_path: Path):
    a = _write(tmp_path / "a.yaml", {"extends": "b.yaml", "name": "a"})
    _write(tmp_path / "b.yaml", {"extends": "a.yaml", "name": "b"})
    with pytest.raises(PlanError) as info:
        load_plan(a)
    assert len(info.value.problems) == 1
    assert "cycle" in info.value.problems[0]
    assert "extends" in info.value.problems[0]


def test_extends_self_is_a_cycle(tmp_path: Path):
    a = _write(tmp_path / "self.yaml", {"extends": "self.yaml"})
    with pytest.raises(PlanError) as info:
        load_plan(a)
    assert "cycle" in info.value.problems[0]


def test_extends_missing_parent(tmp_path: Path):
    a = _write(tmp_path / "a.yaml", {"extends": "gone.yaml"})
    with pytest.raises(PlanError) as info:
        load_plan(a)
    assert "gone.yaml" in info.value.problems[0]
    assert "no such scenario file" in info.value.problems[0]


def test_overrides_apply_after_extends(tmp_path: Path, default_data: dict):
    _write(tmp_path / "a.yaml", default_data)
    b = _write(tmp_path / "b.yaml", {"extends": "a.yaml", "algorithm": {"alpha": 2}})
    plan = load_plan(b, ["algorithm.alpha=4"])
    assert plan.algorithm.alpha == 4


# ---------------------------------------------------------------- models


def test_qwen3_8b_preset_geometry():
    m = ModelSpec.model_validate("Qwen3-8B")
    assert m.name == "Qwen3-8B"
    assert m.params == pytest.approx(8.19e9, rel=0.01)
    assert m.kv_bytes_per_token == 2 * 36 * 8 * 128 * 2
    assert m.weight_bytes == 2 * m.params
    assert m.active_params == m.params  # dense model


def test_preset_names_are_case_insensitive():
    assert ModelSpec.model_validate("qwen3-8b") == ModelSpec.model_validate("Qwen3-8B")


@pytest.mark.parametrize("preset, billions", [("Qwen3-14B", 14.8), ("Qwen3-32B", 32.8), ("Qwen2.5-7B", 7.6)])
def test_other_presets_parameter_counts(preset: str, billions: float):
    assert ModelSpec.model_validate(preset).params == pytest.approx(billions * 1e9, rel=0.03)


def test_preset_fields_can_be_overridden():
    m = ModelSpec.model_validate({"preset": "Qwen3-8B", "layers": 18})
    assert m.layers == 18 and m.hidden == 4096
    assert m.kv_bytes_per_token == 2 * 18 * 8 * 128 * 2


def test_model_from_explicit_numbers_validates():
    explicit = "{name: my-8b, layers: 36, hidden: 4096, heads: 32, kv_heads: 8, head_dim: 128, " \
               "intermediate: 12288, vocab: 151936}"
    plan = load_plan(default_scenario(), [f"model={explicit}"])
    assert plan.model.name == "my-8b"
    assert plan.model.params == ModelSpec.model_validate("Qwen3-8B").params
    assert plan.model.kv_bytes_per_token == 2 * 36 * 8 * 128 * 2


def test_heads_not_multiple_of_kv_heads_rejected():
    problems = problems_of(["model={preset: Qwen3-8B, kv_heads: 5}"])
    line = only_line(problems, "model:")
    assert "heads (32)" in line and "kv_heads (5)" in line


def test_moe_active_cannot_exceed_experts():
    with pytest.raises(ValueError, match="moe_active_experts"):
        ModelSpec.model_validate({"preset": "Qwen3-8B", "moe_experts": 4, "moe_active_experts": 8})


def test_generation_tp_must_divide_heads():
    problems = problems_of(["placement.generation.0.tp=3", "placement.generation.0.workers=1"])
    line = only_line(problems, "placement.generation.0.tp:")
    assert "32 heads" in line


# ---------------------------------------------------------------- suggestions (difflib)


def test_misspelt_field_suggests_the_closest_and_lists_a_few():
    (line,) = problems_of(["algorithm.alpah=2"])  # 13 fields: too many to list, the closest only
    assert line == "algorithm.alpah: unknown field; did you mean 'alpha'?"
    (line,) = problems_of(["weight_sync.bucket_mbb=2"])
    assert line.startswith("weight_sync.bucket_mbb: unknown field; did you mean 'bucket_mb'? fields are: ")
    (line,) = problems_of(["tasks.CodeExec.env.step.sigam=1"])  # a lognormal: its own fields
    assert line == "tasks.CodeExec.env.step.sigam: unknown field; did you mean 'sigma'? fields are: median, sigma, max"


def test_misspelt_task_suggests_the_closest():
    with pytest.raises(PlanError) as info:
        load_plan(default_scenario(), ["tasks.Frozenlake.share=0.3"])
    assert "did you mean 'FrozenLake'? tasks are: FrozenLake, GEM-Math, CodeExec" in info.value.problems[0]


def test_missing_scenario_suggests_shipped_names():
    from rollart.scenarios_catalog import resolve_existing

    with pytest.raises(PlanError) as info:
        resolve_existing("paper/qwen3-8b")
    assert "did you mean 'paper/qwen3-8b-128gpu'?" in info.value.problems[0]


def test_extends_resolves_shipped_names(tmp_path):
    for parent in ("paper/qwen3-8b-128gpu.yaml", "paper/qwen3-8b-128gpu"):
        what_if = tmp_path / "what-if.yaml"
        what_if.write_text(f"extends: {parent}\nalgorithm: {{alpha: 2}}\n")
        plan = load_plan(what_if)
        assert plan.algorithm.alpha == 2 and plan.model.name == "Qwen3-8B" and plan.name == "what-if"


def test_serverless_instance_concurrency_is_bounded_by_the_platform() -> None:
    line = only_line(problems_of(["cluster.serverless.instance_concurrency=100"]), "cluster.serverless:")
    assert "instance_concurrency (100)" in line and "max_concurrency" in line
    assert "cluster.serverless.billing" in " ".join(problems_of(["cluster.serverless.billing=monthly"]))


@pytest.mark.parametrize("gpus, tp", [(1, 2), (3, 2)])
def test_reward_gpus_must_be_whole_judge_engines(gpus: int, tp: int) -> None:
    """gpus 1 at tp 2 built a tp-2 judge billed as one GPU; gpus 3 at tp 2 billed an idle GPU."""
    reward = f"placement.reward={{where: dedicated, pool: h800, gpus: {gpus}, tp: {tp}}}"
    line = only_line(problems_of(["cluster.gpu_pools.h800.count=12", reward]), "placement.reward.gpus:")
    assert f"{gpus} is not a multiple of placement.reward.tp ({tp})" in line


def test_the_policy_models_context_window_field_is_refused() -> None:
    # max_context_tokens is the judge's window; the policy's context is set per task
    line = only_line(problems_of(["model.max_context_tokens=8192"]), "model.max_context_tokens:")
    assert "each task's max_context_tokens" in line


def test_the_judges_tp_must_divide_the_reward_models_heads() -> None:
    """As a generation worker's tp must split the policy's heads (Qwen2.5-7B has 28)."""
    dedicated = ["cluster.gpu_pools.h800.count=16", "placement.reward={where: dedicated, pool: h800, gpus: 8, tp: 8}"]
    line = only_line(problems_of(dedicated), "placement.reward.tp:")
    assert "8 does not divide the reward model's 28 heads" in line
    line = only_line(problems_of(["cluster.serverless.tp=3"]), "cluster.serverless.tp:")
    assert "3 does not divide the reward model's 28 heads" in line


@pytest.mark.parametrize(("override", "words"), [
    ("cluster.links.cross_cluster.bandwidth_gbps=1e-30", "cluster.links.cross_cluster.bandwidth_gbps"),
    ("cluster.links.cross_cluster.latency_us=1e308", "cluster.links.cross_cluster.latency_us"),
    ("cluster.links.cross_cluster.kind=nvlink", "cross_cluster.kind: nvlink joins GPUs inside one server"),
])
def test_absurd_links_are_refused_naming_the_field(override: str, words: str) -> None:
    """A 1e-30 Gb/s link ran 2 steps to a normal-looking result, and a 1e308 µs latency ended as
    "algorithm.max_sim_hours: did not finish"; an NVLink between clusters gave 2.9 Tb/s (helper-88)."""
    from tests.conftest import small_plan
    with pytest.raises(PlanError) as err:
        small_plan([override])
    assert any(words in p for p in err.value.problems), err.value.problems
