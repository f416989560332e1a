"""The node's parameters: every engine and policy parameter declared with a descriptor (policy ones
from their settings dataclasses), bad values turned into a ConfigError naming the parameter, policy
parameters inheriting the general ones, old names declared and still working."""
import ast
import importlib.util
import inspect
import pathlib
import re

import pytest
import rclpy
from rclpy.node import Node
from rclpy.parameter import Parameter

from streamcache_ros.engine.cache import POLICIES, policy_parameters
from streamcache_ros.engine.errors import ConfigError
from streamcache_ros.engine.factory import ENGINE_DEFAULTS, build_policy
from streamcache_ros.engine.parameters import RUNTIME
from streamcache_ros.engine.session import Session
from streamcache_ros.node import params


@pytest.fixture(scope="module")
def context():
    ctx = rclpy.Context()
    rclpy.init(context=ctx, domain_id=0)  # no communication happens: nodes are only declared
    yield ctx
    rclpy.try_shutdown(context=ctx)


@pytest.fixture
def make_node(context):
    made = []

    def make(**overrides):
        node = Node("params_under_test", context=context, start_parameter_services=False,
                    parameter_overrides=[Parameter(k, value=v) for k, v in overrides.items()],
                    automatically_declare_parameters_from_overrides=False)
        made.append(node)
        return node

    yield make
    for node in made:
        node.destroy_node()


def test_contract_parameters_are_declared_with_descriptions(make_node):
    node = make_node()
    values = params.declare_all(node)
    for name in ["camera_topics", "model_path", "policy", "budget_tokens", "sample_fps", "chunk_frames", "device",
                 "dtype", "max_question_tokens", "max_new_tokens", "autostart", *ENGINE_DEFAULTS]:
        assert name in values, name
        assert node.describe_parameter(name).description, name
    assert values["camera_topics"] == ["/camera/image_raw"]
    assert values["policy"] == "hermes"
    assert values["autostart"] is True
    for policy in POLICIES:
        for arg in policy_parameters(policy):
            assert f"{policy}.{arg}" in values


def test_ranges_are_in_the_descriptors(make_node):
    node = make_node()
    params.declare_all(node)
    fps = node.describe_parameter("sample_fps").floating_point_range[0]
    assert fps.from_value > 0
    assert node.describe_parameter("chunk_frames").integer_range[0].from_value == 1
    # never read_only (a lifecycle reconfigure changes it): the descriptor says when it may change
    assert not node.describe_parameter("model_path").read_only
    assert "lifecycle reconfigure" in node.describe_parameter("model_path").additional_constraints
    assert node.describe_parameter("sample_fps").additional_constraints == "may change while the node runs"
    # a policy's settings give its parameters real descriptions and ranges
    n_e = node.describe_parameter("h2svc.n_e")
    assert n_e.integer_range[0].from_value == 2 and "STCE" in n_e.description
    lam = node.describe_parameter("hermes.lambda_mid").floating_point_range[0]
    assert (lam.from_value, lam.to_value) == (0.0, 1.0)
    assert "constructor argument" not in node.describe_parameter("hermes.guidance_queries").description
    assert "embedding | hidden" in node.describe_parameter("hermes.guidance_queries").description


@pytest.mark.parametrize("overrides, parameter, words", [
    ({"budget_tokens": "lots"}, "budget_tokens", "expected integer, got string"),
    ({"sample_fps": 0.0}, "sample_fps", "out of range"),
    ({"chunk_frames": 0}, "chunk_frames", "out of range"),
    ({"autostart": 3}, "autostart", "expected bool"),
    ({"camera_topics": 5}, "camera_topics", "expected string_array"),
])
def test_a_bad_value_names_its_parameter(make_node, overrides, parameter, words):
    with pytest.raises(ConfigError) as err:
        params.declare_all(make_node(**overrides))
    assert err.value.parameter == parameter
    assert words in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("topics, words", [
    ([], "is empty"),
    (["/a", "/a"], "listed twice"),
    (["/ok", "bad topic!"], "not a valid topic name"),
    ([" "], "empty entry"),
])
def test_camera_topics_are_validated(topics, words):
    with pytest.raises(ConfigError) as err:
        params.validate_node_params({"camera_topics": topics})
    assert err.value.parameter == "camera_topics" and words in str(err.value)


def test_the_standing_questions_are_bounded():
    """No more than MAX_WATCH_QUESTIONS stand at once, at configure as at runtime."""
    most = [f"Did you see a red circle {i}?" for i in range(params.MAX_WATCH_QUESTIONS)]
    assert params.check_watch_questions(most) == most
    with pytest.raises(ConfigError, match=f"at most {params.MAX_WATCH_QUESTIONS} stand at once") as err:
        params.validate_node_params({"camera_topics": ["/cam"], "watch_questions": most + ["Is there one more?"]})
    assert err.value.parameter == "watch_questions"


def test_archive_path_off_from_a_shell_is_a_string():
    """`-p archive_path:=off` reaches the node as YAML's bool false: taken as 'off'."""
    taken = params.as_declared(Parameter("archive_path", value=False), Parameter.Type.STRING)
    assert (taken.type_, taken.value) == (Parameter.Type.STRING, "off")
    kept = params.as_declared(Parameter("archive_path", value=True), Parameter.Type.STRING)
    assert params.type_error(kept, Parameter.Type.STRING)  # 'on' means nothing: refused as before


def test_attention_backend_is_one_of_three():
    with pytest.raises(ConfigError) as err:
        params.validate_node_params({"camera_topics": ["/cam"], "attention": "fast"})
    assert err.value.parameter == "attention" and "auto|sdpa|flash" in str(err.value)


def test_relative_and_compressed_topics_are_fine():
    params.validate_node_params({"camera_topics": ["image_raw", "/cam/image_raw/compressed", "~/private"]})


def test_policy_parameters_default_to_the_general_ones(make_node):
    values = params.declare_all(make_node(reindex="eager", **{"fifo.reindex_margin": 7}))
    assert values["fifo.reindex"] == "eager" and values["full.reindex"] == "eager"
    assert values["fifo.reindex_margin"] == 7 and values["full.reindex_margin"] == ENGINE_DEFAULTS["reindex_margin"]
    engine = params.engine_params(values)
    assert "camera_topics" not in engine and "autostart" not in engine
    assert engine["fifo.reindex_margin"] == 7 and engine["budget_tokens"] == ENGINE_DEFAULTS["budget_tokens"]


def test_unknown_overrides_are_reported(make_node):
    node = make_node(**{"budget_tokens": 128, "hermes.no_such_thing": 1.0, "chunk_frame": 4})
    params.declare_all(node)
    assert params.unknown_overrides(node) == ["chunk_frame", "hermes.no_such_thing"]


def test_old_parameter_names_are_declared_and_still_work(make_node, qwen_adapter, llava_adapter):
    values = params.declare_all(make_node(**{"hermes.qwen_reindex": "dense_rank", "hermes.qwen_rope": "layer0",
                                             "hermes.qwen_mid_omega": [0.5, 0.25], "hermes.llava_mid_k": [9.0, 1.0],
                                             "fifo.qwen_reindex": "dense_rank"}))
    for name in ("hermes.qwen_reindex", "hermes.qwen_rope", "hermes.llava_mid_omega", "hermes.llava_mid_k",
                 "hermes.qwen_mid_omega", "hermes.qwen_mid_k", "full.qwen_reindex", "fifo.qwen_reindex"):
        assert name in values, name
    engine = params.engine_params(values)
    qwen = build_policy(qwen_adapter, "hermes", {**engine, "budget_tokens": 400})
    qwen.setup(qwen_adapter.geometry())
    s = qwen.settings
    assert (s.mrope_reindex, s.mrope_rotation) == ("dense_rank", "layer0")
    # a family's old names apply to that family's models: qwen_mid_omega here, the family's preset for k
    assert (s.mid_omega, s.mid_k) == ([0.5, 0.25], [20.0, 12.0])
    llava = build_policy(llava_adapter, "hermes", {**engine, "budget_tokens": 400})
    llava.setup(llava_adapter.geometry())
    assert (llava.settings.mid_omega, llava.settings.mid_k) == ([1.0, 0.9], [9.0, 1.0])
    assert build_policy(qwen_adapter, "fifo", {**engine, "budget_tokens": 400}).settings.mrope_reindex == "dense_rank"
    # the defaults of the old names change nothing: the new names and the family's presets apply
    plain = build_policy(qwen_adapter, "hermes", {**params.engine_params(params.declare_all(make_node())),
                                                  "hermes.mid_k": [30.0, 3.0], "budget_tokens": 400})
    plain.setup(qwen_adapter.geometry())
    assert (plain.settings.mid_omega, plain.settings.mid_k, plain.settings.mrope_reindex) == (
        [0.75, 0.6], [30.0, 3.0], "shift")


def test_an_old_name_and_its_new_name_set_apart_are_refused(qwen_adapter):
    with pytest.raises(ConfigError, match="qwen_mid_omega .* and mid_omega .* are both set and differ"):
        build_policy(qwen_adapter, "hermes", {"hermes.qwen_mid_omega": [0.5, 0.25], "hermes.mid_omega": [0.3, 0.1],
                                              "budget_tokens": 400})
    # set alike, they agree: no error
    agreed = build_policy(qwen_adapter, "hermes", {"hermes.qwen_reindex": "dense_rank",
                                                   "hermes.mrope_reindex": "dense_rank", "budget_tokens": 400})
    assert agreed.settings.mrope_reindex == "dense_rank"
    with pytest.raises(ConfigError, match="parameter 'hermes': qwen_mid_omega \\(now mid_omega\\) must be two numbers"):
        build_policy(qwen_adapter, "hermes", {"hermes.qwen_mid_omega": [1.0], "budget_tokens": 400})


def test_the_node_speaks_to_the_engine_only():
    """No module of the node imports the cache policies' package: what it needs of them (the policy
    names, their settings, which parameters change at runtime) comes from engine.parameters."""
    node_dir = pathlib.Path(params.__file__).parent
    for path in sorted(node_dir.glob("*.py")):
        for found in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(found, ast.ImportFrom):
                module = "." * found.level + (found.module or "")
                names = [module + "." + alias.name for alias in found.names]
            elif isinstance(found, ast.Import):
                names = [alias.name for alias in found.names]
            else:
                continue
            for name in names:
                assert not re.match(r"(\.\.|streamcache_ros\.)engine\.cache\b", name), f"{path.name}: {name}"


def test_the_runtime_parameters_are_what_session_tune_takes():
    taken = [name for name in inspect.signature(Session.tune).parameters if name != "self"]
    assert sorted(RUNTIME) == sorted(taken)
    for name in RUNTIME:
        assert params.all_specs()[name].runtime, name


def check_docs():
    spec = importlib.util.spec_from_file_location("check_docs", pathlib.Path(__file__).parents[1] / "scripts" /
                                                  "check_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_docs_parameter_tables_are_the_declarations():
    """docs/interfaces.md's parameter tables are made from the declarations (scripts/check_docs.py
    --write), and check_docs fails where they differ: here a stale default and a missing policy."""
    docs = check_docs()
    text = docs.INTERFACES.read_text(encoding="utf-8")
    assert docs.parameter_problems(text) == []
    assert "| `model_path` | string | `'world-qwen2_5_vl'` |" in text and "uniform" in text
    stale = text.replace("| `budget_tokens` | int ≥ 0 | `0` |", "| `budget_tokens` | int ≥ 0 | `6000` |")
    assert stale != text and "budget_tokens" in docs.parameter_problems(stale)[0]
    assert docs.parameter_problems(text.replace("fifo\\|full\\|h2svc\\|hermes\\|uniform", "fifo\\|full\\|h2svc\\|hermes"))


def test_every_parameter_has_a_declared_type():
    """An empty default says nothing of its type: params.EMPTY_ARRAY_TYPES gives it (else `ros2 param
    describe` showed "byte array"); scripts/check_docs.py prints the same type."""
    from rclpy.parameter import Parameter  # noqa: PLC0415

    kinds = {name: params.declared_type(name, spec) for name, spec in params.all_specs().items()}
    assert kinds["watch_questions"] == Parameter.Type.STRING_ARRAY
    assert kinds["evidence_layers"] == Parameter.Type.INTEGER_ARRAY
    assert Parameter.Type.BYTE_ARRAY not in kinds.values() and Parameter.Type.NOT_SET not in kinds.values()
    assert all(params.descriptor(name, spec).dynamic_typing for name, spec in params.all_specs().items())
