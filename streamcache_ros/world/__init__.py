"""The shape world: seeded camera streams with ground truth, and the questions asked about them.

The rules are those of docs/world.md: one uniform background per stream, filled circles, squares and
upright triangles in six colours, at most two objects in view, every state at least 4 frames, and
between states exactly one event (appear, leave, move, recolour). Questions are asked only where
their precondition holds, with the options the page lists and the true option's index.

    stream = make_stream(seed=7, num_frames=64, question_points=[32, 64])
    rgb = stream.frame(10)                      # [H, W, 3] uint8, as the camera would publish it
    for q in stream.questions(64):              # every kind whose precondition holds after 64 frames
        print(q.kind, q.text, q.options, q.options[q.answer_index])

Where any camera stream will do (the demo bag, the tests, the benchmarks), ``world_frames`` yields the
frames of one fixed seeded stream at the size asked for:

    frames = list(world_frames(8, start=40, height=120, width=160))

No ROS and no torch here: the bag writer, the trainer and the accuracy benchmark all use it.
"""
from __future__ import annotations

from .fixed import (FIXED_STREAM_SEED, FIXED_STREAM_SEGMENT_FRAMES, fixed_look, world_frame, world_frames)
from .patrol import (MAP_FRAME, PLACE_NAMES, ChainedPatrolStream, MapPlace, PatrolStream, make_long_patrol_stream,
                     make_patrol_stream, patrol_map, places_yaml)
from .questions import (ask_now_color, ask_now_count, ask_first_color, ask_first_shape, ask_seen,
                        ask_now_shape, ask_seen_in_window, ask_seen_hard_negative, comparison_questions,
                        ask_before_color, ask_moved, ask_last_seen, ask_first_seen, ASKERS)
from .stream import (WorldStream, draw_shape, make_stream, HOUR_FRAMES, kept_out, ChainedStream,
                     make_long_stream)
from .truth import (COLOURS, COLOUR_NAMES, SHAPES, ENCODINGS, NAMED_SIZES, OPTION_KINDS, QUESTION_KINDS,
                    LONG_MEMORY_KINDS, WINDOW_KINDS, QUESTION_TEXT, SEEN_PROBE, STABLE_FRAMES, FRAME_PERIOD_S,
                    ObjectView, Move, Recolour, Question, Look, random_look)

__all__ = ["ASKERS", "COLOURS", "COLOUR_NAMES", "ChainedPatrolStream", "ChainedStream", "ENCODINGS",
           "FIXED_STREAM_SEED", "FIXED_STREAM_SEGMENT_FRAMES", "FRAME_PERIOD_S", "HOUR_FRAMES", "LONG_MEMORY_KINDS",
           "Look", "MAP_FRAME", "MapPlace", "Move", "NAMED_SIZES", "OPTION_KINDS", "ObjectView", "PLACE_NAMES",
           "PatrolStream", "QUESTION_KINDS", "QUESTION_TEXT", "Question", "Recolour", "SEEN_PROBE", "SHAPES",
           "STABLE_FRAMES", "WINDOW_KINDS", "WorldStream", "ask_before_color", "ask_first_color", "ask_first_seen",
           "ask_first_shape", "ask_last_seen", "ask_moved", "ask_now_color", "ask_now_count", "ask_now_shape",
           "ask_seen", "ask_seen_hard_negative", "ask_seen_in_window", "comparison_questions", "draw_shape",
           "fixed_look", "kept_out", "make_long_patrol_stream", "make_long_stream", "make_patrol_stream",
           "make_stream", "patrol_map", "places_yaml", "random_look", "world_frame", "world_frames"]
