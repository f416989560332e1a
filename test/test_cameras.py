"""Per-camera position clocks and budget shares (docs/architecture.md "Positions"; cache/clocks.py).

Each camera's chunks are numbered and encoded as if that camera were alone, re-indexed on their own
clock, and, with ``camera_budget_share: equal`` (the default), kept within the camera's share of the
bound: a camera beside a busier one holds what it would hold alone with its share.
"""
import numpy as np
import pytest
import torch

from streamcache_ros.engine import ConfigError, Session, SessionConfig, SnapshotError, load_adapter
from streamcache_ros.engine.cache import PAD_UNIT, PREFIX_UNIT, TEXT_UNIT, FullCachePolicy
from streamcache_ros.engine.cache.clocks import fair_shares, newest_units
from streamcache_ros.engine.cache.sap import HEAD_MAP_FILE, HeadMap
from streamcache_ros.engine.factory import build_policy
from streamcache_ros.engine.adapters.models import BUNDLED_DIR
from streamcache_ros.engine.memory.snapshots import SNAPSHOT_FORMAT

from conftest import FAMILIES, make_variant, policy_for

MAX_POSITIONS = 160
MARGIN = 64  # lazy: a clock is renumbered once its own positions pass 96
CHUNK = 4
ALONE = {"full": {}, "fifo": {"budget_tokens": 32}, "uniform": {"budget_tokens": 32},
         "hermes": {"budget_tokens": 32}, "h2svc": {"w_s": 1, "w_w": 2, "n_e": 3}}
# beside a busier camera, twice the bound: with equal shares camera A keeps what it keeps alone
BESIDE = {"full": {}, "fifo": {"budget_tokens": 64}, "uniform": {"budget_tokens": 64},
          "hermes": {"budget_tokens": 64}, "h2svc": {"w_s": 2, "w_w": 4, "n_e": 6}}
FRAMES = {"full": 12}  # the full cache grows: a stream both clocks hold in the small range


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    """Both families with a small position range (Qwen at 0.25 fps: t advances 16 a temporal patch)."""
    folder = tmp_path_factory.mktemp("small_range")
    return {family: load_adapter(make_variant(folder, family, max_position_embeddings=MAX_POSITIONS), device="cpu",
                                 dtype="float32", sample_fps=0.25) for family in FAMILIES}


def make(adapter, family, name, settings, **extra):
    settings = dict(settings, **extra)
    if name == "h2svc":  # the variant is the bundled model with another position range: the same heads
        settings["head_map"] = HeadMap.load(BUNDLED_DIR / family / HEAD_MAP_FILE)
    return Session(adapter, policy_for(adapter, name, **settings),
                   SessionConfig(chunk_frames=CHUNK, max_question_tokens=64, max_new_tokens=4, mc_max_new_tokens=4))


def clock_rows(session, camera):
    """Per storage row (a layer, or an H2SVC KV head), what it holds on ``camera``'s clock: each
    token's stamp (-1: prefix, -2: summary), its positions, its key."""
    clock = session.ledger.cameras.index(camera)
    rows = []
    for stores in session.policy.layer_stores():
        for _, store in stores:
            per_row = store.units.dim() == 2
            for r in range(store.rows):
                units = store.units[r] if per_row else store.units
                clocks = store.clocks[r] if per_row else store.clocks
                positions = store.positions[r] if per_row else store.positions
                mine = (units != PAD_UNIT) & ((units == PREFIX_UNIT) | (clocks == clock))
                stamps = [min(session.ledger.units[u].stamps) if u >= 0 else float(u) for u in units[mine].tolist()]
                rows.append((stamps, positions[:, mine], store.keys[0, r][mine]))
    return rows


def ask_a(session, camera):
    answer = session.ask("what is there?", ["a circle", "a square", "nothing"], camera=camera)
    assert answer.option_index >= 0  # scored: always one of the options
    return answer


@pytest.mark.parametrize("mode", ["eager", "lazy"])
@pytest.mark.parametrize("name", list(ALONE))
@pytest.mark.parametrize("family", FAMILIES)
def test_a_camera_beside_a_busier_one_is_where_it_would_be_alone(adapters, frames, family, name, mode):
    """Camera A alone, and A beside a camera B sending twice as many frames (the bound doubled):
    every layer (every H2SVC head) holds the same tokens of A at the same positions, with the same
    keys, through evictions and re-indexes; and a question about A gets the same answer."""
    adapter = adapters[family]
    alone = make(adapter, family, name, ALONE[name], reindex=mode, reindex_margin=MARGIN)
    beside = make(adapter, family, name, BESIDE[name], reindex=mode, reindex_margin=MARGIN)
    count = FRAMES.get(name, 32)
    a, b = frames(count), frames(2 * count, start=count)
    rate = 1 if name == "full" else 2  # a bounded policy: B at least as busy as A
    for i in range(count):
        alone.add_frame(a[i], stamp=float(i), camera="A")
        beside.add_frame(a[i], stamp=float(i), camera="A")
        for j in range(rate):
            beside.add_frame(b[rate * i + j], stamp=i + 0.5 * j, camera="B")
    alone.flush(), beside.flush()
    assert alone.status().chunks_failed == beside.status().chunks_failed == 0
    if name != "full":  # A's own clock was renumbered (and more than once when eager)
        assert alone.policy.stats().reindex_events >= (3 if mode == "eager" else 1)
    mine, theirs = clock_rows(alone, "A"), clock_rows(beside, "A")
    assert len(mine) == len(theirs)
    for (stamps, positions, keys), (stamps_b, positions_b, keys_b) in zip(mine, theirs):
        assert stamps == stamps_b
        assert torch.equal(positions, positions_b)
        torch.testing.assert_close(keys, keys_b, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(torch.tensor(ask_a(alone, "A").option_probabilities),
                               torch.tensor(ask_a(beside, "A").option_probabilities), atol=1e-4, rtol=0)


class RecordingFull(FullCachePolicy):
    """The full cache, remembering where each question's first token was placed."""

    question_starts: list[float] = []

    def rotary_positions(self, layer, positions, new):
        if layer == 0 and bool((new.units == TEXT_UNIT).all()) and len(new) > 1:
            self.question_starts.append(float(positions[:, 0].max()))
        return positions


@pytest.mark.parametrize("options", [[], ["yes", "no"]])  # decoded, and scored
def test_a_question_sits_after_its_cameras_positions(adapter, frames, options):
    """A question about one camera starts right after that camera's largest position (on every
    axis); one about every camera right after the largest position held."""
    policy = RecordingFull()
    session = Session(adapter, policy, SessionConfig(chunk_frames=CHUNK))
    video = frames(18)
    for i in range(6):
        session.add_frame(video[i], stamp=float(i), camera="quiet")
        for j in range(2):
            session.add_frame(video[6 + 2 * i + j], stamp=i + 0.5 * j, camera="busy")
    session.flush()
    store = policy.layers[0]
    ends = {camera: float(store.positions[:, (store.clocks == session.ledger.cameras.index(camera))].max())
            for camera in ("quiet", "busy")}
    assert ends["quiet"] < ends["busy"]  # each clock counts its own camera's frames only
    for camera, start in (("quiet", ends["quiet"] + 1), ("busy", ends["busy"] + 1), ("", ends["busy"] + 1)):
        policy.question_starts = []
        session.ask("what is there?", options, camera=camera, max_new_tokens=2)
        assert policy.question_starts[0] == start, camera


def test_a_chunk_sees_only_its_own_camera(adapter, frames):
    """A camera's tokens are computed as if it were alone: B's frames between A's change nothing
    in A's keys (the full cache, so nothing is evicted)."""
    alone = Session(adapter, policy_for(adapter, "full"), SessionConfig(chunk_frames=CHUNK))
    beside = Session(adapter, policy_for(adapter, "full"), SessionConfig(chunk_frames=CHUNK))
    video = frames(16)
    for i in range(8):
        alone.add_frame(video[i], stamp=float(i), camera="A")
        beside.add_frame(video[8 + i], stamp=float(i), camera="B")
        beside.add_frame(video[i], stamp=float(i), camera="A")
    for (stamps, positions, keys), (stamps_b, positions_b, keys_b) in zip(clock_rows(alone, "A"),
                                                                           clock_rows(beside, "A")):
        assert stamps == stamps_b and torch.equal(positions, positions_b)
        torch.testing.assert_close(keys, keys_b, atol=1e-4, rtol=1e-4)


# -- budget shares --------------------------------------------------------------------------------
def clock_tokens(session, camera):
    """Per storage row, the tokens held on ``camera``'s clock (summary tokens included, prefix not)."""
    return [sum(1 for s in stamps if s != PREFIX_UNIT) for stamps, _, _ in clock_rows(session, camera)]


SHARE = {"fifo": {"budget_tokens": 48}, "uniform": {"budget_tokens": 48}, "hermes": {"budget_tokens": 48},
         "h2svc": {"w_s": 2, "w_w": 4, "n_e": 6}}


@pytest.mark.parametrize("name", list(SHARE))
def test_a_quiet_camera_keeps_its_share(adapter, frames, name):
    """The rear camera sends 12 frames, then the front camera 60: with ``equal`` shares every layer
    (every H2SVC head) still holds the rear camera's half of the bound, and the two halves fill it;
    with ``shared`` the busy front camera pushes the rear one out."""
    per_unit = adapter.preprocess(frames(adapter.frames_per_unit)).tokens_per_unit
    held = {}
    for share in ("equal", "shared"):
        session = Session(adapter, policy_for(adapter, name, camera_budget_share=share, **SHARE[name]),
                          SessionConfig(chunk_frames=CHUNK))
        video = frames(72)
        for i in range(12):
            session.add_frame(video[i], stamp=float(i), camera="rear")
        for i in range(60):
            session.add_frame(video[12 + i], stamp=12.0 + i, camera="front")
        session.flush()
        held[share] = (clock_tokens(session, "rear"), clock_tokens(session, "front"))
        if name == "h2svc":  # each bank: half its window (N_e) in units, per KV head
            policy = session.policy
            bounds = [{0: policy.windows[0], 1: policy.windows[1], 2: policy.n_e}[bank] * per_unit
                      for stores in policy.layer_stores() for bank, store in stores for _ in range(store.rows)]
        else:
            bounds = [session.policy.budget_tokens] * len(held[share][0])
        if share == "equal":
            for rear, front, bound in zip(*held[share], bounds):
                assert rear + front <= bound
                # half each, within one unit (uniform keeps whole units; a deep layer's summary is one token)
                assert bound // 2 - per_unit <= rear <= bound // 2 + 1, (rear, bound)
                assert bound // 2 - per_unit <= front <= bound // 2 + 1, (front, bound)
    assert sum(held["shared"][0]) < sum(held["equal"][0])


def test_fair_shares_leave_what_a_camera_does_not_need_to_the_others():
    assert fair_shares({0: 100, 1: 100}, 64) == {0: 32, 1: 32}
    assert fair_shares({0: 10, 1: 100}, 64) == {0: 10, 1: 54}  # the quiet one needs less than half
    assert fair_shares({0: 10, 1: 20}, 64) == {0: 10, 1: 20}  # everything fits
    assert fair_shares({0: 50, 1: 50, 2: 50}, 64) == {0: 22, 1: 21, 2: 21}  # the remainder to the lowest ids
    assert fair_shares({0: 50, 1: 1}, 64) == {0: 50, 1: 1}
    assert fair_shares({0: 9, 1: 9, 2: 9}, 3, least=2) == {0: 2, 1: 2, 2: 2}  # at least 2 each, over the capacity
    assert fair_shares({5: 7}, 4) == {5: 4}


def test_fifo_windows_per_camera():
    units = torch.tensor([-1, 0, 1, 2, 3, 4, 5, 6, 7])
    lanes = torch.tensor([-1, 0, 1, 1, 0, 1, 1, 1, 0])
    kept = newest_units(units, lanes, capacity=4)  # two each: lane 0 keeps 3 and 7, lane 1 keeps 5 and 6
    assert units[kept].tolist() == [-1, 3, 5, 6, 7]
    # while unit 7 of lane 0 is encoded: lane 0 keeps one unit before it (its share, 2, less unit 7)
    kept = newest_units(units, lanes, capacity=4, arriving=(0, 7))
    assert units[kept & (lanes == 0)].tolist() == [3, 7]


def test_camera_budget_share_is_checked(adapter):
    with pytest.raises(ConfigError, match="camera_budget_share.*equal, shared"):
        build_policy(adapter, "fifo", {"budget_tokens": 400, "camera_budget_share": "fair"})
    assert build_policy(adapter, "hermes", {"budget_tokens": 400, "camera_budget_share": "shared"}) \
        .settings.camera_budget_share == "shared"
    assert not build_policy(adapter, "full", {"camera_budget_share": "shared"}).settings_class.takes(
        "camera_budget_share")  # the full cache keeps everything: no budget to share


# -- snapshots ------------------------------------------------------------------------------------
def two_camera_snapshot(adapter, frames, path):
    session = Session(adapter, policy_for(adapter, "fifo", budget_tokens=64), SessionConfig(chunk_frames=CHUNK))
    video = frames(16)
    for i in range(8):
        session.add_frame(video[i], stamp=float(i), camera="/front")
        session.add_frame(video[8 + i], stamp=float(i), camera="/rear")
    session.save(str(path))
    return session


def test_a_snapshot_of_cameras_the_node_does_not_have_is_refused(adapter, frames, tmp_path):
    saved = two_camera_snapshot(adapter, frames, tmp_path / "two.pt")
    node = Session(adapter, policy_for(adapter, "fifo", budget_tokens=64),
                   SessionConfig(chunk_frames=CHUNK, cameras=("/front",)))
    video = frames(4, start=20)
    for i, frame in enumerate(video):
        node.add_frame(frame, stamp=100.0 + i, camera="/front")
    before = node.policy.state_dict()
    frames_before = node.status().frames_in_memory
    with pytest.raises(SnapshotError, match=r"camera\(s\) '/rear' that this node does not have"):
        node.load(str(tmp_path / "two.pt"))
    assert node.status().frames_in_memory == frames_before and node.ledger.cameras == ["/front"]
    assert all(torch.equal(a["keys"], b["keys"]) for a, b in zip(before["layers"], node.policy.state_dict()["layers"]))
    # a node with both cameras (or one that names none) adopts it, with its cameras
    both = Session(adapter, policy_for(adapter, "fifo", budget_tokens=64),
                   SessionConfig(chunk_frames=CHUNK, cameras=("/rear", "/front")))
    assert both.load(str(tmp_path / "two.pt")) == saved.status().frames_in_memory
    assert both.status().cameras == ["/front", "/rear"]
    assert both.ask("what is there?", camera="/rear", max_new_tokens=2).frames_in_memory == \
        saved.status().camera_memory["/rear"].frames


def test_a_snapshot_of_the_old_format_is_refused(adapter, frames, tmp_path):
    two_camera_snapshot(adapter, frames, tmp_path / "new.pt")
    data = (tmp_path / "new.pt").read_bytes()
    (tmp_path / "old.pt").write_bytes(data.replace(b" %d " % SNAPSHOT_FORMAT, b" 2 ", 1))
    session = Session(adapter, policy_for(adapter, "fifo", budget_tokens=64), SessionConfig(chunk_frames=CHUNK))
    with pytest.raises(SnapshotError, match=r"of format 2 \(every camera's frames on one position clock.*record the "
                                            r"memory again.*reads format 3"):
        session.load(str(tmp_path / "old.pt"))
    assert session.status().frames_in_memory == 0


def test_snapshots_keep_each_cameras_clock(adapter, frames, tmp_path):
    saved = two_camera_snapshot(adapter, frames, tmp_path / "two.pt")
    loaded = Session(adapter, policy_for(adapter, "fifo", budget_tokens=64), SessionConfig(chunk_frames=CHUNK))
    loaded.load(str(tmp_path / "two.pt"))
    for camera in ("/front", "/rear"):
        for (s, p, k), (s2, p2, k2) in zip(clock_rows(saved, camera), clock_rows(loaded, camera)):
            assert s == s2 and torch.equal(p, p2) and torch.equal(k, k2)
    more = frames(4, start=40)
    for i, frame in enumerate(more):  # and the streams go on, each on its own clock
        saved.add_frame(frame, stamp=50.0 + i, camera="/rear")
        loaded.add_frame(frame, stamp=50.0 + i, camera="/rear")
    assert np.allclose(saved.ask("what?", ["a", "b"], camera="/rear").option_probabilities,
                       loaded.ask("what?", ["a", "b"], camera="/rear").option_probabilities, atol=1e-5)
