"""What the working memory holds: the books of every unit and frame (ledger.py) and the snapshot
files (snapshots.py)."""
