"""The ROS-free engine: model adapters, cache policies, the streaming session."""
from .adapters import ModelAdapter, load_adapter
from .cache import POLICIES, CachePolicy, make_policy
from .errors import (AnswerError, ChunkError, ConfigError, FrameError, ModelLoadError, QuestionError, SnapshotError,
                     StreamCacheError)
from .session import Session, SessionConfig
from .status import Answer, ChunkReport, DeviceMemory, EngineInfo, SessionStatus

__all__ = ["Answer", "AnswerError", "CachePolicy", "ChunkError", "ChunkReport", "ConfigError", "DeviceMemory",
           "EngineInfo", "FrameError", "ModelAdapter",
           "ModelLoadError", "POLICIES", "QuestionError", "Session", "SessionConfig", "SessionStatus",
           "SnapshotError", "StreamCacheError", "load_adapter", "make_policy"]
