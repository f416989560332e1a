"""The ROS-free engine: model adapters, cache policies, the streaming session."""
from .adapters import ModelAdapter, load_adapter
from .cache import POLICIES, CachePolicy, make_policy
from .errors import (AnswerError, ArchiveError, ChunkError, ConfigError, FrameError, ModelLoadError, QuestionError, SnapshotError,
                     StreamCacheError)
from .factory import build_session
from .failpoints import ENV as FAILPOINTS_ENV
from .failpoints import arm_from_environment as arm_failpoints
from .places import Place, PlaceError, Pose, PoseTrack, load_places
from .places.place import resolve_place
from .session import Session, SessionConfig
from .status import Answer, CacheSummary, ChunkReport, CompressionOutcome, DeviceMemory, EngineInfo, SessionStatus

__all__ = ["Answer", "AnswerError", "ArchiveError", "CachePolicy", "CacheSummary", "ChunkError", "ChunkReport", "CompressionOutcome",
           "ConfigError", "DeviceMemory", "EngineInfo", "FAILPOINTS_ENV", "FrameError", "ModelAdapter",
           "ModelLoadError", "POLICIES", "Place", "PlaceError", "Pose", "PoseTrack", "QuestionError", "Session", "SessionConfig", "SessionStatus",
           "SnapshotError", "StreamCacheError", "arm_failpoints", "build_session", "load_adapter", "load_places", "make_policy",
           "resolve_place"]
