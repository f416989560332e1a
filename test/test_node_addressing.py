"""Three robots on one ROS domain (docs/interfaces.md "Finding the node"): each call with a namespace
reaches that node, through the Python client and through streamcache-ask; a call with no namespace
waits for discovery to settle and is refused, naming all three, never answered by one picked by
chance. Each node listens on a camera of its own, so its refusal of another camera names the node
that answered. Timeouts only guard against hangs."""
import subprocess

import pytest

from node_procs import HANG_GUARD_S, ROOT, Proc, child_env, client_of, python_module, tiny_node

ROBOTS = ("/robot_a", "/robot_b", "/robot_c")


@pytest.fixture(scope="module")
def nodes(domain):
    procs = [Proc(tiny_node(ns, [f"{ns}/cam"]), child_env(domain)) for ns in ROBOTS]
    try:
        for proc in procs:
            proc.wait_for_output("active: listening on")
        yield procs
    finally:
        for proc in procs:
            proc.__exit__(None, None, None)


def ask_cli(domain, *args) -> subprocess.CompletedProcess:
    return subprocess.run(python_module("streamcache_ros.client.ask_cli", *args), cwd=ROOT, env=child_env(domain),
                          capture_output=True, text=True, timeout=HANG_GUARD_S)


def test_each_call_reaches_the_named_node(domain, nodes):
    for proc, ns in zip(nodes, ROBOTS):
        with client_of(proc, domain, ns) as client:
            refused = client.ask("What is on the table?", camera="/elsewhere/cam")
            assert not refused.success and f"camera_topics: {ns}/cam" in refused.error_message, refused.error_message
        done = ask_cli(domain, "--namespace", ns, "--camera", "/elsewhere/cam", "What is on the table?")
        assert done.returncode == 1 and f"camera_topics: {ns}/cam" in done.stderr, done.stderr


def test_no_namespace_is_refused_naming_every_node(domain, nodes):
    from streamcache_ros.client.client import StreamCacheClient  # noqa: PLC0415

    with pytest.raises(LookupError) as refused:
        StreamCacheClient(timeout=HANG_GUARD_S, domain_id=domain).close()
    assert all(ns in str(refused.value) for ns in ROBOTS), refused.value
    # the CLI from a fresh process: its participant starts with an empty graph and sees the nodes
    # one by one, where an early look would find one
    done = ask_cli(domain, "What is on the table?")
    assert done.returncode == 3, done.stdout + done.stderr
    assert "3 streamcache nodes" in done.stderr and all(ns in done.stderr for ns in ROBOTS), done.stderr
