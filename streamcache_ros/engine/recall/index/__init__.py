"""The archive's index: a vector per archived frame in a space shared with the question's text, so
the moment a question is about is found by ranking, not by replaying the day (docs/archive.md
"The index")."""
from .encoder import RETRIEVAL_FILE, RetrievalEncoder, RetrievalSettings
from .ranking import Candidate, FrameScores, best_by_chunk, candidate_chunks, precision_at, rank_frames, recall_at, sightings

__all__ = ["Candidate", "FrameScores", "RETRIEVAL_FILE", "RetrievalEncoder", "RetrievalSettings", "best_by_chunk", "candidate_chunks",
           "precision_at", "rank_frames", "recall_at", "sightings"]
