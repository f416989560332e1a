"""What each diagnostic status says and at which level (OK / WARN / ERROR mean something)."""
from diagnostic_msgs.msg import DiagnosticStatus

from streamcache_ros.engine.status import CacheSummary, ChunkReport, DeviceMemory, SessionStatus
from streamcache_ros.node import diagnostics
from streamcache_ros.node.sampler import CameraCounters

OK, WARN, ERROR = DiagnosticStatus.OK, DiagnosticStatus.WARN, DiagnosticStatus.ERROR
S = 1_000_000_000


def run(task_fn):
    stat = diagnostics.updater_lib.DiagnosticStatusWrapper()
    stat.summary(ERROR, "No message was set")
    out = task_fn(stat)
    return out.level, out.message, {kv.key: kv.value for kv in out.values}


def test_camera_levels():
    counters = CameraCounters("/cam", 1.0)
    active = [True]
    task = diagnostics.CameraTask(counters, lambda: active[0])
    counters.arrived(S)
    counters.sampled(S)
    counters.ingested()
    level, message, values = run(task.run)
    assert level == OK and message == "1 frames taken into memory"
    assert values["Frames received"] == "1" and values["Frames taken into memory"] == "1"

    counters.arrived(2 * S)
    counters.dropped()  # the slot was overwritten: the encoder is slower than the camera
    level, message, values = run(task.run)
    assert level == WARN and "dropped" in message and values["Frames dropped (encoder busy)"] == "1"

    counters.arrived(3 * S)
    counters.arrived(4 * S)
    counters.rejected("encoding", "unsupported encoding 'yuv422'")
    level, message, _ = run(task.run)
    assert level == WARN and "1 frame(s) rejected: unsupported encoding 'yuv422'" == message

    counters.arrived(5 * S)
    counters.rejected("step", "step 8 is less than width 3 x 3 bytes")
    level, message, values = run(task.run)
    assert level == ERROR and message.startswith("every frame rejected")
    assert values["Rejected: encoding"] == "1" and values["Rejected: step"] == "1"

    level, message, _ = run(task.run)  # nothing since the last update: the rate task says so
    assert level == OK
    active[0] = False
    assert run(task.run)[0] == WARN


def engine_status(policy="fifo", model_id="tiny", frames_in_memory=16, kv_tokens=468, kv_bytes=119808,
                  budget_tokens=96, layer_tokens=(116, 116, 116, 116), bank_tokens=(), gpu_allocated_bytes=0,
                  gpu_reserved_bytes=0, gpu_total_bytes=0, chunks_encoded=0, chunks_failed=0, encode_ms=0.0,
                  prefill_ms=0.0, compress_ms=0.0, last_ttft_ms=0.0, prefix_tokens=20, **more):
    """The engine's typed status, from the figures a MemoryStatus message carries."""
    cache = CacheSummary(policy, list(layer_tokens), kv_tokens, kv_bytes, budget_tokens, bank_tokens=list(bank_tokens),
                         bank_names=["instantaneous", "short_term", "episodic"][:len(bank_tokens)])
    chunk = ChunkReport(0, "", 4, 2, 8, encode_ms, prefill_ms, compress_ms) if chunks_encoded else None
    device = DeviceMemory(gpu_allocated_bytes, gpu_reserved_bytes, 0, gpu_total_bytes)
    return SessionStatus(policy=policy, model_id=model_id, frames_in_memory=frames_in_memory, cache=cache,
                         prefix_tokens=prefix_tokens, device_memory=device,
                         last_chunk=chunk, chunks_encoded=chunks_encoded, chunks_failed=chunks_failed,
                         last_ttft_ms=last_ttft_ms, **more)


def make(fields, chunk_error="", gpu_total_bytes=0, **view):
    status = engine_status(**fields, gpu_total_bytes=gpu_total_bytes)
    return diagnostics.EngineTasks(lambda: diagnostics.EngineView(status, chunk_span_s=8.0, chunk_error=chunk_error,
                                                                  **view))


def memory(**fields):
    return fields


def test_memory_levels():
    level, message, values = run(make(memory()).memory)
    assert level == OK and "16 frames" in message and values["KV bytes"] == "119808"
    assert values["Layer tokens min/mean/max"] == "116/116.0/116" and "GPU total (MiB)" not in values
    level, message, _ = run(make(memory(layer_tokens=[116, 117, 116, 116])).memory)
    assert level == WARN and "over budget: a layer holds 97 video tokens, budget 96" in message
    unbounded = memory(budget_tokens=0, layer_tokens=[500, 500])
    assert run(make(unbounded).memory)[:2] == (OK, "16 frames, 0.1 MiB KV (unbounded)")
    banked = memory(budget_tokens=0, bank_tokens=[24, 96, 180])
    level, message, values = run(make(banked).memory)
    assert (level, message) == (OK, "16 frames, 0.1 MiB KV (bounded by its banks)")
    assert values["Bank tokens (instantaneous/short-term/episodic)"] == "24 96 180"
    gpu = memory(gpu_reserved_bytes=95 * 2**20, gpu_allocated_bytes=90 * 2**20)
    level, message, values = run(make(gpu, gpu_total_bytes=100 * 2**20).memory)
    assert level == WARN and "CUDA memory nearly full" in message and values["GPU reserved (MiB)"] == "95.0"


def test_a_budget_lowered_at_runtime_is_pending_until_the_next_chunk():
    """budget_tokens lowered while the node runs: the memory comes to it at the next chunk's
    compression; until then the memory status says so (OK), not "over budget" (WARN) for as long as
    the camera is idle. Over budget after a chunk is still WARN (a compression fault)."""
    lowered = memory(budget_tokens=48)  # the layers hold 96 video tokens
    level, message, values = run(make(lowered, budget_pending=True).memory)
    assert (level, message) == (OK, "budget changed to 48 video tokens per layer: pending, the next chunk brings "
                                     "the memory to it (a layer holds 96 now)")
    assert values["Budget (video tokens per layer)"] == "48"
    level, message, _ = run(make(lowered).memory)
    assert level == WARN and message.startswith("over budget")


def test_latency_levels():
    before_any = make(memory())
    assert run(before_any.latency)[:2] == (OK, "no chunk encoded yet")
    fast = memory(chunks_encoded=3, encode_ms=100.0, prefill_ms=50.0, compress_ms=10.0, last_ttft_ms=42.0)
    level, message, values = run(make(fast).latency)
    assert level == OK and values["Last TTFT (ms)"] == "42.0" and values["Stream time per chunk (ms)"] == "8000.0"
    slow = memory(chunks_encoded=3, encode_ms=7000.0, prefill_ms=1500.0, compress_ms=10.0)
    level, message, _ = run(make(slow).latency)
    assert level == WARN and "falls behind" in message  # 8.5 s of work for 8 s of stream
    failing = make(memory(chunks_encoded=3, chunks_failed=1), chunk_error="ChunkError: out of memory")
    level, message, _ = run(failing.latency)
    assert level == ERROR and "1 chunk(s) failed: ChunkError: out of memory" == message
    assert run(failing.latency)[0] == OK  # reported once: the next update has no new failure


def test_the_latency_budget_is_shared_by_every_camera():
    """With two cameras each fills a chunk in the chunk's stream time, so the
    encoder has half of it per chunk. 222 ms for a chunk of 267 ms of stream was OK with 46 % of the
    sampled frames dropped."""
    chunk = memory(chunks_encoded=3, encode_ms=200.0, prefill_ms=20.0, compress_ms=2.0)
    one = diagnostics.EngineTasks(lambda: diagnostics.EngineView(engine_status(**chunk), chunk_span_s=0.267))
    assert run(one.latency)[0] == OK
    two = diagnostics.EngineTasks(lambda: diagnostics.EngineView(engine_status(**chunk), chunk_span_s=0.267,
                                                                 cameras=2))
    level, message, values = run(two.latency)
    assert level == WARN and "falls behind" in message and "2 cameras: 134 ms each" in message
    assert values["Encoder time per chunk, all cameras (ms)"] == "133.5" and values["Cameras"] == "2"


def test_a_cameras_qos_and_queue_are_shown():
    counters = CameraCounters("/cam", 1.0)
    task = diagnostics.CameraTask(counters, lambda: True, qos=lambda: ("reliable: matched to 1 publisher(s), all "
                                                                       "reliable", 2))
    counters.arrived(S)
    counters.queued(1)
    values = run(task.run)[2]
    assert values["QoS reliability"].startswith("reliable: matched") and values["QoS changes (publishers came or went)"] == "2"
    assert values["Frames that waited in the queue"] == "1"


def test_chunks_failing_again_and_again_turn_the_memory_error():
    once = memory(chunks_encoded=3, chunks_failed=1, chunks_failed_in_a_row=1, newest_stamp=12.0)
    assert run(make(once, chunk_error="ChunkError: boom").memory)[0] == OK  # one failure: latency says it
    stale = memory(chunks_encoded=3, chunks_failed=5, chunks_failed_in_a_row=diagnostics.FAILING_CHUNKS,
                   newest_stamp=12.0)
    level, message, values = run(make(stale, chunk_error="ChunkError: boom").memory)
    assert level == ERROR and message.startswith(f"the memory is not updating: the last {diagnostics.FAILING_CHUNKS}")
    assert "ChunkError: boom" in message and "up to stamp 12.000" in message
    assert values["Chunks failed in a row"] == str(diagnostics.FAILING_CHUNKS)
