"""budget_tokens as a new user meets it (docs/interfaces.md, "Changing parameters at runtime"), a real
process with the bundled world model, whose folder gives its own budget (96 video tokens per layer,
its streamcache.json) for budget_tokens 0, the default:

- the parameter shows the budget in force, not the 0 it was given;
- 0 set while the node runs is the model's own again, not "cannot hold one frame";
- a budget lowered while the camera is idle is said to be pending in the memory diagnostic (OK) until
  the next chunk brings the memory to it, not "over budget" (WARN) for as long as the camera is idle;
- unconfigured again, the parameter shows 0 again, so the next configure takes the model's own.

Expected figures by hand: the world model takes 6 tokens for a unit of two frames at any frame size;
bags of frames 0.5 s apart sampled at 1 fps, chunks of 4 frames. Timeouts only guard hangs."""
import pytest
from diagnostic_msgs.msg import DiagnosticStatus
from lifecycle_msgs.msg import Transition
from lifecycle_msgs.srv import ChangeState

from node_procs import status_name, Proc, child_env, replay_lock_step, tiny_node
from streamcache_ros.tools import bagfile

NS = "/sc_budget"
NODE = f"{NS}/streamcache_node"
CAM = "/budget/cam"
MODEL, MODEL_BUDGET, UNIT_TOKENS = "world-qwen2_5_vl", 96, 6
S = 1_000_000_000


@pytest.fixture(scope="module")
def bags(tmp_path_factory):
    d = tmp_path_factory.mktemp("bags")
    return {"first": bagfile.make_bag(d / "first", frames=16, fps=2.0, topic=CAM),  # 8 sampled: 4 units
            "later": bagfile.make_bag(d / "later", frames=8, fps=2.0, topic=CAM, first_frame=16,
                                      start_ns=bagfile.DEFAULT_START_NS + 100 * S)}  # 4 sampled: one chunk


@pytest.fixture(scope="module")
def node(domain):
    with Proc(tiny_node(NS, [CAM], model_path=MODEL), child_env(domain)) as proc:  # budget_tokens 0: the default
        yield proc


def memory_diagnostic(probe, budget: int):
    """The first "memory" status from now on that shows ``budget``."""
    start = len(probe.diagnostics)

    def found():
        return next((s for a in probe.diagnostics[start:] for s in a.status if s.name == status_name(NS, "memory")
                     and {kv.key: kv.value for kv in s.values}["Budget (video tokens per layer)"] == str(budget)),
                    None)

    probe.wait_for(lambda: found() is not None, what=f"a memory diagnostic with budget {budget}")
    return found()


def test_the_parameter_shows_the_budget_in_force(client, probe):
    assert client.memory_status().budget_tokens == MODEL_BUDGET
    assert probe.get_parameter(NODE, "budget_tokens") == MODEL_BUDGET


def test_0_set_at_runtime_is_the_models_own_budget_again(client, probe):
    assert probe.set_parameter(NODE, "budget_tokens", 48).successful
    assert probe.get_parameter(NODE, "budget_tokens") == 48 == client.memory_status().budget_tokens
    again = probe.set_parameter(NODE, "budget_tokens", 0)
    assert again.successful, again.reason
    assert probe.get_parameter(NODE, "budget_tokens") == MODEL_BUDGET == client.memory_status().budget_tokens


def test_a_lowered_budget_is_pending_until_the_next_chunk(client, domain, bags, probe):
    replay_lock_step(domain, bags["first"], NS, "--fast")
    status = client.memory_status()
    prefix = max(status.layer_tokens) - 4 * UNIT_TOKENS  # every layer holds the 4 units: no compression yet
    assert status.frames_in_memory == 8 and min(status.layer_tokens) == max(status.layer_tokens)
    assert probe.set_parameter(NODE, "budget_tokens", UNIT_TOKENS).successful
    pending = memory_diagnostic(probe, UNIT_TOKENS)  # the camera is idle: no chunk comes
    assert pending.level == DiagnosticStatus.OK, pending.message
    assert "pending" in pending.message and "over budget" not in pending.message
    replay_lock_step(domain, bags["later"], NS, "--fast")  # one chunk: compressed to the new budget
    status = client.memory_status()
    assert max(status.layer_tokens) - prefix <= UNIT_TOKENS and status.budget_tokens == UNIT_TOKENS
    applied = memory_diagnostic(probe, UNIT_TOKENS)
    assert applied.level == DiagnosticStatus.OK and "pending" not in applied.message, applied.message


def test_unconfigured_the_parameter_shows_0_again(probe):
    def transition(tid):
        return probe.call(ChangeState, f"{NODE}/change_state", ChangeState.Request(transition=Transition(id=tid)))

    assert probe.set_parameter(NODE, "budget_tokens", 0).successful  # the model's own again: shown as 96
    assert transition(Transition.TRANSITION_DEACTIVATE).success and transition(Transition.TRANSITION_CLEANUP).success
    assert probe.get_parameter(NODE, "budget_tokens") == 0
    assert transition(Transition.TRANSITION_CONFIGURE).success
    assert probe.get_parameter(NODE, "budget_tokens") == MODEL_BUDGET
