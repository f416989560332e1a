"""The world models' training examples (examples.py) and frame heads (frame_targets.py), laid out
exactly as the session lays out a stream (stream/layout.py)."""
