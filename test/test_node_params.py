"""The node's parameters: every engine and policy parameter declared with a descriptor, bad values
turned into a ConfigError naming the parameter, policy parameters inheriting the general ones."""
import pytest
import rclpy
from rclpy.node import Node
from rclpy.parameter import Parameter

from streamcache_ros.engine.cache import POLICIES, policy_parameters
from streamcache_ros.engine.errors import ConfigError
from streamcache_ros.engine.factory import ENGINE_DEFAULTS
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
    assert values["policy"] == ("hermes" if "hermes" in POLICIES else "fifo")
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
    assert node.describe_parameter("model_path").read_only


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
