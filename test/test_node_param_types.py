"""Parameter types over DDS (docs/interfaces.md "Changing parameters at runtime"): a node in a process
of its own, asked through its parameter services as `ros2 param describe/get/set` ask. Array
parameters hold and describe their declared type (string, integer, double arrays; once "byte
array"), an empty list of any type (the ros2 CLI sends a bool array) is taken as the declared one,
an integer for a double is taken as that number, and any other type is refused with the node's own
reason naming the parameter; the node goes on answering."""
import pytest
from rcl_interfaces.msg import ParameterType
from rcl_interfaces.srv import DescribeParameters, GetParameters, SetParameters
from rclpy.parameter import Parameter, parameter_value_to_python

from node_procs import Probe, Proc, child_env, client_of, tiny_node

NS = "/sc_types"
NODE = f"{NS}/streamcache_node"


@pytest.fixture(scope="module")
def node(domain):
    with Proc(tiny_node(NS, [f"{NS}/cam"], watch_questions="['Did you see a red circle?']"), child_env(domain)) as proc:
        proc.wait_for_output("active: listening on")
        yield proc


@pytest.fixture(scope="module")
def probe(domain, node):
    probe = Probe(domain)
    yield probe
    probe.close()


def described(probe, name: str) -> int:
    return probe.call(DescribeParameters, f"{NODE}/describe_parameters",
                      DescribeParameters.Request(names=[name])).descriptors[0].type


def held(probe, name: str) -> tuple[int, object]:
    """The parameter's (ParameterType, value) as `ros2 param get` receives them."""
    value = probe.call(GetParameters, f"{NODE}/get_parameters", GetParameters.Request(names=[name])).values[0]
    python = parameter_value_to_python(value)
    return value.type, list(python) if isinstance(python, (list, tuple)) or hasattr(python, "tolist") else python


def set_typed(probe, name: str, kind: Parameter.Type, value):
    request = SetParameters.Request(parameters=[Parameter(name, kind, value).to_parameter_msg()])
    return probe.call(SetParameters, f"{NODE}/set_parameters", request).results[0]


def test_arrays_hold_and_describe_their_types(probe):
    expected = {"watch_questions": ParameterType.PARAMETER_STRING_ARRAY,
                "evidence_layers": ParameterType.PARAMETER_INTEGER_ARRAY,
                "camera_topics": ParameterType.PARAMETER_STRING_ARRAY,
                "hermes.mid_omega": ParameterType.PARAMETER_DOUBLE_ARRAY,
                "h2svc.ratios": ParameterType.PARAMETER_DOUBLE_ARRAY}
    for name, kind in expected.items():
        assert described(probe, name) == kind, name
        assert held(probe, name)[0] == kind, name
    assert held(probe, "watch_questions")[1] == ["Did you see a red circle?"]  # from -p


def test_convertible_values_are_taken_in_the_declared_type(probe):
    assert set_typed(probe, "watch_questions", Parameter.Type.BOOL_ARRAY, []).successful  # `ros2 param set ... "[]"`
    assert held(probe, "watch_questions") == (ParameterType.PARAMETER_STRING_ARRAY, [])
    assert set_typed(probe, "sample_fps", Parameter.Type.INTEGER, 2).successful  # `ros2 param set ... sample_fps 2`
    assert held(probe, "sample_fps") == (ParameterType.PARAMETER_DOUBLE, 2.0)


@pytest.mark.parametrize("name, kind, value, words", [
    ("sample_fps", Parameter.Type.STRING, "fast", "parameter 'sample_fps': expected double, got string 'fast'"),
    ("evidence_layers", Parameter.Type.DOUBLE_ARRAY, [1.5], "parameter 'evidence_layers': expected integer_array"),
    ("watch_questions", Parameter.Type.INTEGER_ARRAY, [1, 2], "parameter 'watch_questions': expected string_array"),
    ("sample_fps", Parameter.Type.INTEGER, 0, "sample_fps out of range"),  # converted, then its range
])
def test_a_wrong_type_gets_the_nodes_reason_and_nothing_changes(probe, domain, node, name, kind, value, words):
    before = held(probe, name)
    result = set_typed(probe, name, kind, value)
    assert not result.successful and words in result.reason, result.reason
    assert held(probe, name) == before
    assert described(probe, name) == before[0]  # the declared type, not the refused one
    with client_of(node, domain, NS) as client:  # still serving
        assert client.memory_status().frames_in_memory == 0
