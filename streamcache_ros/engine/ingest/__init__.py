"""A frame's path: a chunk of frames encoded, prefilled into the cache and compressed (pipeline.py),
in blocks (prefill.py), with the guidance a policy asks for before it compresses (guidance.py)."""
