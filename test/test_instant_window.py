"""The instant window (``instant_frames``, docs/architecture.md "The instant window"): every bounded
policy keeps the newest N frames of each camera whole, in every layer and KV head, beside what it
keeps of the past. On hand-made geometries fed as the session would (no model), and once through a
session on the bundled tiny Qwen2.5-VL."""
import pytest
import torch

from streamcache_ros.engine import Session, SessionConfig
from streamcache_ros.engine.cache import (PREFIX_UNIT, CacheGeometry, ChunkContext, GuidancePass, NewTokens,
                                          SettingError, make_policy)
from streamcache_ros.engine.cache.rope import RotarySpec
from streamcache_ros.engine.cache.sap import HeadMap
from streamcache_ros.engine.errors import ConfigError, SnapshotError
from streamcache_ros.engine.factory import build_session

from conftest import family_traits, policy_for, states_equal

D = 8
LAYERS, KV_HEADS, GROUP = 4, 3, 2
UNIT_TOKENS = 4  # a 2x2 grid
BOUNDED = ["fifo", "uniform", "hermes", "h2svc"]
# a bound that holds a few units: budget_tokens for the layer-managed policies, h2svc's windows
BOUNDS = {"fifo": {"budget_tokens": 6 * UNIT_TOKENS}, "uniform": {"budget_tokens": 6 * UNIT_TOKENS},
          "hermes": {"budget_tokens": 6 * UNIT_TOKENS}, "h2svc": {"w_s": 2, "w_w": 4, "n_e": 6}}


def geometry(family):
    inv_freq = 1.0 / (100.0 ** (torch.arange(0, D, 2).float() / D))
    section = (1, 1, 2) if family == "qwen2_5_vl" else None
    return CacheGeometry(num_layers=LAYERS, num_q_heads=KV_HEADS * GROUP, num_kv_heads=KV_HEADS, head_dim=D,
                         dtype=torch.float32, device=torch.device("cpu"),
                         rotary=RotarySpec(inv_freq=inv_freq, mrope_section=section),
                         max_position_embeddings=100_000, traits=family_traits(family))


def head_map(tmp_path):
    """Every layer: one instantaneous, one short-term and one episodic KV head."""
    kinds = [[0, 1, 2]] * LAYERS
    scores = [[kind + 0.01 * (layer * KV_HEADS + h) for h, kind in enumerate(row)] for layer, row in enumerate(kinds)]
    HeadMap(model_id="synthetic", config_hash="c0ffee", num_layers=LAYERS, num_kv_heads=KV_HEADS, tad_v2v=scores,
            tad_t2v=scores, score=scores, bank_id=kinds).save(tmp_path / "map.json")
    return HeadMap.load(tmp_path / "map.json")


class Feed:
    """A policy fed chunks as the session feeds them: each layer's q/k/v through ``attend`` (one
    unit per forward where the policy asks), the arrival hooks, the guidance it asks for, and
    ``after_chunk`` with each unit's frames. Seeded: two feeds of one stream get the same tensors."""

    def __init__(self, name, tmp_path, family="llava_onevision", seed=0, **settings):
        settings = {**BOUNDS[name], **settings}
        if name == "h2svc":
            settings.setdefault("ratios", [1 / 3, 1 / 3, 1 / 3])
            settings["head_map"] = head_map(tmp_path)
        self.policy = make_policy(name, **settings)
        self.policy.setup(geometry(family))
        self.axes = self.policy.geometry.rotary.axes
        self.frames_per_unit = 2 if family == "qwen2_5_vl" else 1
        self.gen = torch.Generator().manual_seed(seed)
        self.next_unit, self.next_chunk = 0, 0
        self.unit_camera: dict[int, int] = {}
        self.frames_of: dict[int, int] = {}
        self.forward(torch.arange(3, dtype=torch.float32)[None].expand(self.axes, 3).clone(),
                     torch.full((3,), PREFIX_UNIT), torch.full((3,), -1), None)

    def rand(self, *shape):
        return torch.randn(*shape, generator=self.gen)

    def forward(self, rel, units, chunks, clock):
        new = NewTokens(rel, units, chunks, clock)
        n = units.numel()
        for layer in range(LAYERS):
            q, k, v = self.rand(1, KV_HEADS * GROUP, n, D), self.rand(1, KV_HEADS, n, D), self.rand(1, KV_HEADS, n, D)
            self.policy.attend(layer, q, k, v, new)
        return new

    def rel(self, count):
        """Relative positions of ``count`` units of a 2x2 grid (M-RoPE: t advancing 2 a unit)."""
        if self.axes == 1:
            return torch.arange(count * UNIT_TOKENS, dtype=torch.float32)[None]
        t = (torch.arange(count) * 2).repeat_interleave(UNIT_TOKENS)
        h = torch.tensor([0, 0, 1, 1]).repeat(count)
        w = torch.tensor([0, 1, 0, 1]).repeat(count)
        return torch.stack([t, h, w]).float()

    def chunk(self, frames, camera=0):
        """A chunk of ``frames`` frames of ``camera`` (its last unit may hold fewer frames)."""
        sizes = [min(self.frames_per_unit, frames - i) for i in range(0, frames, self.frames_per_unit)]
        first = self.next_unit
        ids = list(range(first, first + len(sizes)))
        self.next_unit += len(sizes)
        unit_frames, frame = {}, 0
        for unit, size in zip(ids, sizes):
            unit_frames[unit] = tuple(range(frame, frame + size))
            frame += size
            self.unit_camera[unit], self.frames_of[unit] = camera, size
        units = torch.tensor(ids).repeat_interleave(UNIT_TOKENS)
        chunks = torch.full_like(units, self.next_chunk)
        rel = self.rel(len(ids))
        if self.policy.prefill_unit_by_unit:
            for i, unit in enumerate(ids):
                cols = slice(i * UNIT_TOKENS, (i + 1) * UNIT_TOKENS)
                moved = rel[:, :cols.start].max() + 1 if i else 0.0  # the offset the units before took
                self.policy.after_prefill(self.forward(rel[:, cols] - moved, units[cols], chunks[cols], camera))
        else:
            self.policy.after_prefill(self.forward(rel, units, chunks, camera))
        context = ChunkContext(self.next_chunk, unit_frames=unit_frames)
        self.next_chunk += 1
        if self.policy.needs_guidance:
            request = self.policy.guidance_request([], context)
            if request is not None:
                context.guidance = [GuidancePass(p.layers, [(self.rand(1, KV_HEADS * GROUP, 5, D),
                                                              self.rand(1, KV_HEADS, 5, D)) for _ in p.layers])
                                    for p in request.prompts]
        return self.policy.after_chunk(context)

    def newest(self, camera, frames):
        """The camera's newest units that cover ``frames`` frames."""
        out, covered = [], 0
        for unit in sorted((u for u, c in self.unit_camera.items() if c == camera), reverse=True):
            if covered >= frames:
                break
            out.append(unit)
            covered += self.frames_of[unit]
        return sorted(out)

    def rows(self):
        """Every storage row's unit ids: a layer's (every head the same), or one KV head's."""
        return [row for store in self.policy.storage.stores()
                for row in (store.units[None] if store.shared else store.units)]


def held_whole(feed, units):
    """Every row holds every token of each of ``units``."""
    return all(int((row == u).sum()) == UNIT_TOKENS for row in feed.rows() for u in units)


@pytest.mark.parametrize("family", ["llava_onevision", "qwen2_5_vl"])
@pytest.mark.parametrize("name", BOUNDED)
def test_the_newest_frames_are_held_whole_beside_the_bound(name, family, tmp_path):
    frames = 5
    feed = Feed(name, tmp_path, family, instant_frames=frames)
    bare = Feed(name, tmp_path, family)
    for i in range(20):
        feed.chunk(3 + i % 3)  # chunks of 3 to 5 frames: the window spans chunks, some units hold 1 frame
        bare.chunk(3 + i % 3)
        window = feed.newest(0, frames)
        assert held_whole(feed, window), (i, window)
    # the bound is the policy's own, beside the window: per row, what the same policy holds
    # without it, plus the window's tokens (within a unit: units differ in frames, and uniform and
    # hermes keep whole units or scores of their own)
    window = set(feed.newest(0, frames))
    for with_window, without in zip(feed.rows(), bare.rows()):
        instant = int(torch.isin(with_window, torch.tensor(sorted(window))).sum())
        assert instant == len(window) * UNIT_TOKENS
        past = int(((with_window >= 0) | (with_window < PREFIX_UNIT)).sum()) - instant  # summaries count
        alone = int(((without >= 0) | (without < PREFIX_UNIT)).sum())
        assert abs(past - alone) <= UNIT_TOKENS * (2 if name == "h2svc" else 1), (past, alone)
    stats = feed.policy.stats()
    if name != "h2svc":
        assert stats.instant_tokens == len(window) * UNIT_TOKENS
        assert max(stats.layer_tokens) - 3 - stats.instant_tokens <= BOUNDS[name]["budget_tokens"]


@pytest.mark.parametrize("name", BOUNDED)
def test_an_instant_window_of_zero_is_the_policy_as_before(name, tmp_path):
    off, bare = Feed(name, tmp_path, instant_frames=0), Feed(name, tmp_path)
    for i in range(16):
        assert off.chunk(2 + i % 4).as_dict() == bare.chunk(2 + i % 4).as_dict()
    assert states_equal(off.policy.state_dict(), bare.policy.state_dict())
    assert off.policy.config_dict() == bare.policy.config_dict()
    assert "instant_frames" not in off.policy.config_dict()  # snapshots made before it existed load


@pytest.mark.parametrize("share", ["equal", "shared"])
@pytest.mark.parametrize("name", BOUNDED)
def test_each_camera_keeps_its_own_newest_frames(name, share, tmp_path):
    frames = 4
    feed = Feed(name, tmp_path, instant_frames=frames, camera_budget_share=share)
    for i in range(24):
        feed.chunk(2 + i % 3, camera=0)
        if i % 3 == 0:  # a quieter camera beside it
            feed.chunk(3, camera=1)
        for camera in (0, 1):
            assert held_whole(feed, feed.newest(camera, frames)), (i, camera)


def test_uniform_numbers_units_as_they_arrived_and_spreads_the_past(tmp_path):
    feed = Feed("uniform", tmp_path, instant_frames=4)
    for i in range(30):
        feed.chunk(3, camera=i % 2)
    policy = feed.policy
    for camera in (0, 1):
        mine = sorted(u for u, c in feed.unit_camera.items() if c == camera)
        for unit, time in policy.times.items():  # each unit's index in its own camera's stream
            if feed.unit_camera[unit] == camera:
                assert time == mine.index(unit)
        held = sorted(u for u in policy.times if feed.unit_camera[u] == camera)
        assert held[0] == mine[0]  # the camera's first unit stays: the spread reaches back to it
        assert held[-4:] == mine[-4:]  # and its newest 4 frames (units of 1 frame) are whole


def test_hermes_guidance_and_summary_read_the_past_alone(tmp_path):
    feed = Feed("hermes", tmp_path, instant_frames=6)
    outcomes = [feed.chunk(4) for _ in range(12)]
    assert outcomes[-1].details["guidance_passes"] > 0 and outcomes[-1].details["summary_tokens"] > 0
    window = torch.tensor(feed.newest(0, 6))
    for role, store in zip(feed.policy.roles, feed.policy.layers):
        summaries = torch.nonzero(store.units < PREFIX_UNIT).flatten()
        instant = torch.nonzero(torch.isin(store.units, window)).flatten()
        if role == "deep":  # the summary folds the past: it sits after the past, before the window
            assert summaries.numel() == 1 and int(summaries.max()) < int(instant.min())
            assert float(store.positions[0, summaries[0]]) <= float(store.positions[0, instant].min())


@pytest.mark.parametrize("reindex", ["eager", "lazy"])
def test_a_reindex_renumbers_the_window_with_the_past(reindex, tmp_path):
    feed = Feed("hermes", tmp_path, "qwen2_5_vl", instant_frames=6, reindex=reindex)
    if reindex == "lazy":  # a small range, so that lazy re-indexes too
        feed.policy.rule = feed.policy.settings.reindex_rule(400)
    for _ in range(60):
        feed.chunk(4)
    assert feed.policy.reindex_events > 0
    for store in feed.policy.layers:
        assert store.next_offset(0) < 400  # the window's positions come down with the rest


@pytest.mark.parametrize("share", ["equal", "shared"])
def test_h2svc_banks_keep_their_windows_beside_it_and_stce_takes_a_unit_when_it_leaves(share, tmp_path):
    feed = Feed("h2svc", tmp_path, "qwen2_5_vl", instant_frames=5, camera_budget_share=share)
    policy = feed.policy
    for i in range(30):
        feed.chunk(3 + i % 3)
        window = set(feed.newest(0, 5))  # 3 units: of 1 or 2 frames
        older = sorted(u for u in feed.unit_camera if u not in window)
        for layer in range(LAYERS):
            for group in policy.groups[layer]:
                held = {u for u in group.store.units[0].tolist() if u >= 0}
                if group.bank == 2:  # episodic: its trajectory and the window
                    trajectory = set(policy.trajectory.frames(int(policy.trajectory_rows[(layer, 2)][0])))
                    assert not trajectory & window  # STCE never held (so never evicted) a unit of the window
                    assert held == trajectory | window
                else:  # FIFO: its window of the older units, and the window
                    assert held == set(older[-policy.windows[group.bank]:]) | window
    assert policy.trajectory.evictions > 0 and len(policy.trajectory.frames(0)) == BOUNDS["h2svc"]["n_e"]


@pytest.mark.parametrize("name", BOUNDED)
def test_a_negative_window_is_refused_with_its_name(name, tmp_path):
    settings = {"head_map": head_map(tmp_path)} if name == "h2svc" else {}
    with pytest.raises(SettingError, match="instant_frames"):
        make_policy(name, instant_frames=-1, **settings)
    with pytest.raises(ConfigError, match="parameter 'instant_frames'"):
        build_session({"policy": name, "instant_frames": -2, "model_path": "tiny-llava_onevision", "device": "cpu",
                       "dtype": "float32"})


def test_the_full_cache_takes_no_window():
    assert not make_policy("full").settings_class.takes("instant_frames")
    assert all(make_policy(name, **({"head_map": None} if name == "h2svc" else {})).settings_class.takes(
        "instant_frames") for name in BOUNDED)


def test_the_position_range_counts_the_window():
    session = build_session({"policy": "fifo", "budget_tokens": 64, "model_path": "tiny-llava_onevision",
                             "device": "cpu", "dtype": "float32"})
    from streamcache_ros.engine.cache import ChunkShape
    shape = ChunkShape(unit_tokens=196, unit_positions=196, chunk_tokens=8 * 196, chunk_positions=8 * 196)
    policy = session.policy
    alone = policy.kept_positions(6000, shape)
    windowed = make_policy("fifo", budget_tokens=6000, instant_frames=4)
    assert windowed.kept_positions(6000, shape) == alone + 4 * 196
    # the tiny LLaVA-OneVision's 4096 positions hold a budget of 3400 (4 tokens a frame), not with
    # 32 frames beside it
    tiny = {"policy": "fifo", "budget_tokens": 3400, "model_path": "tiny-llava_onevision", "device": "cpu",
            "dtype": "float32"}
    assert build_session(tiny).policy.budget_tokens == 3400
    with pytest.raises(ConfigError, match="budget_tokens.*instant window of 32 frames.*use budget_tokens <= 3339"):
        build_session({**tiny, "instant_frames": 32})


@pytest.mark.parametrize("name", ["hermes", "h2svc"])
def test_a_session_answers_with_the_window_on_and_its_snapshots_keep_it(name, qwen_adapter, frames, tmp_path):
    bound = {"budget_tokens": 48} if name == "hermes" else {"w_s": 1, "w_w": 2, "n_e": 3}

    def policy(instant_frames):
        return policy_for(qwen_adapter, name, instant_frames=instant_frames, **bound)

    session = Session(qwen_adapter, policy(4), SessionConfig(chunk_frames=3))
    for i, frame in enumerate(frames(21)):
        session.add_frame(frame, stamp=float(i))
    units = session.policy.unit_tokens()
    ledger = session.ledger.units
    per_unit = ledger[max(ledger)].tokens
    # chunks of 3 frames are units of 2 frames and 1: the newest 4 frames are the newest 3 units
    newest = sorted(ledger)[-3:]
    assert [len(ledger[u].stamps) for u in newest] == [1, 2, 1]
    for unit in newest:
        column = units.counts[:, units.units.tolist().index(unit)]
        assert bool((column == per_unit).all())  # whole in every layer
    stats = session.status().cache
    assert stats.instant_tokens == 3 * per_unit
    answer = session.ask("What is in the scene?", max_new_tokens=3)
    assert answer.answer_tokens >= 1
    path = str(tmp_path / "memory.pt")
    session.save(path)
    again = Session(qwen_adapter, policy(4), SessionConfig(chunk_frames=3))
    again.load(path)
    assert states_equal(again.policy.state_dict(), session.policy.state_dict())
    for i, frame in enumerate(frames(6, start=21)):  # both go on alike
        session.add_frame(frame, stamp=21.0 + i)
        again.add_frame(frame, stamp=21.0 + i)
    assert states_equal(again.policy.state_dict(), session.policy.state_dict())
    other = Session(qwen_adapter, policy(2), SessionConfig(chunk_frames=3))
    with pytest.raises(SnapshotError, match="instant_frames"):
        other.load(path)


def test_the_node_declares_it_and_refuses_it_at_runtime():
    from types import SimpleNamespace

    import rclpy
    from rclpy.node import Node
    from rclpy.parameter import Parameter

    from streamcache_ros.node import params
    from streamcache_ros.node.tuning import RuntimeTuning

    context = rclpy.Context()
    rclpy.init(context=context, domain_id=0)  # no communication: the node is only declared
    try:
        node = Node("instant_under_test", context=context, start_parameter_services=False,
                    parameter_overrides=[Parameter("instant_frames", value=-1)],
                    automatically_declare_parameters_from_overrides=False)
        with pytest.raises(ConfigError, match="instant_frames"):
            params.declare_all(node)
        node.destroy_node()
        node = Node("instant_under_test", context=context, start_parameter_services=False)
        assert params.declare_all(node)["instant_frames"] == 0
        tuning = RuntimeTuning(None, SimpleNamespace(policy="hermes"), {}, node, None, None, None, None, None)
        reason = tuning.refusal("instant_frames", 8)
        assert reason.startswith("instant_frames cannot change while instant_under_test is configured (the cache "
                                 "policy is built with it)") and "lifecycle reconfigure" in reason
        node.destroy_node()
    finally:
        rclpy.try_shutdown(context=context)
