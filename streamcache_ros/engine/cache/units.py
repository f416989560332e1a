"""Unit ids that are not video: every sentinel a cache stores beside its tokens, in one place.

A cached token carries the id of the stream unit it came from (a frame; a temporal patch of two
frames on Qwen2.5-VL): 0, 1, 2 ... in arrival order. The ids below mark tokens that are no unit.
"""
PREFIX_UNIT = -1  # the system prompt: kept forever, on top of any budget
SUMMARY_UNIT = -2  # a token made by compression (HERMES's deep-layer summary)
TEXT_UNIT = -3  # question and answer text: temporary, removed after answering
PAD_UNIT = -4  # a padding slot of a per-head store: never attended to, never counted
NO_UNIT = -(2 ** 62)  # fills a ragged table of unit ids; matches no token
