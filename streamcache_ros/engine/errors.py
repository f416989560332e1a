"""Errors the engine raises with a message meant for the person or client who caused them."""


class StreamCacheError(Exception):
    """Base class: the message says what was wrong and, where it helps, what to do."""


class ModelLoadError(StreamCacheError):
    """The model could not be loaded (path missing, unknown family, offline hub id ...)."""


class ConfigError(StreamCacheError):
    """A parameter has a value that cannot work; the message names the parameter."""

    def __init__(self, parameter: str, message: str):
        super().__init__(f"parameter '{parameter}': {message}")
        self.parameter = parameter


class FrameError(StreamCacheError):
    """A frame was refused (wrong shape or type). The memory is unchanged."""


class QuestionError(StreamCacheError):
    """A question was refused before it touched the cache. The memory is unchanged."""


class ChunkError(StreamCacheError):
    """Encoding or prefilling a chunk failed; the chunk was dropped and the memory is unchanged."""


class SnapshotError(StreamCacheError):
    """A memory snapshot could not be written or was refused on load."""
