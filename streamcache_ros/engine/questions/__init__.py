"""A question's path: checked (checks.py, answer_kinds.py), taking its turn at the model (turns.py),
answered from what the memory tier reads (desk.py, answering.py, decoding.py, scoring.py), and
searched through time for `when` (when.py)."""
