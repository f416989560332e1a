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
    """A chunk failed. ``kept`` False: encoding or prefilling failed, the chunk was dropped and the
    memory is as it was before it. ``kept`` True: the chunk was prefilled but compressing failed;
    its frames stay in memory (over budget until the next chunk's compression).
    ``out_of_memory``: the cause was the device running out of memory. ``position_range``: the
    chunk was not taken in because the memory has reached the model's position range (the full
    cache): later chunks are refused too, and questions are answered from what is held."""

    def __init__(self, message: str, kept: bool = False, out_of_memory: bool = False, position_range: bool = False):
        super().__init__(message)
        self.kept = kept
        self.out_of_memory = out_of_memory
        self.position_range = position_range


class AnswerError(StreamCacheError):
    """Answering an accepted question failed part-way (e.g. out of memory); the memory is unchanged."""


class SnapshotError(StreamCacheError):
    """A memory snapshot could not be written or was refused on load."""


# -- failures while the model runs -------------------------------------------------------------------
def is_out_of_memory(err: BaseException) -> bool:
    import torch  # noqa: PLC0415 - the error classes above need no torch

    return isinstance(err, (torch.cuda.OutOfMemoryError, torch.OutOfMemoryError, MemoryError))


def release_device_memory(err: BaseException) -> None:
    """After an out-of-memory error: hand the allocator's cached blocks back, so the next chunk or
    question starts from what the cache really holds."""
    if is_out_of_memory(err):
        import torch  # noqa: PLC0415

        torch.cuda.empty_cache()  # a no-op where CUDA was never initialised


def describe_failure(err: BaseException) -> str:
    """One line for a failure inside the model: its type, its first line, and what to do about an
    out-of-memory error."""
    text = str(err).splitlines()[0] if str(err) else ""
    hint = " (out of memory: lower budget_tokens, chunk_frames or the frame size)" if is_out_of_memory(err) else ""
    return f"{type(err).__name__}: {text}{hint}"


class ArchiveError(StreamCacheError):
    """The archive cannot be used (held by another node, written by another model or for other
    cameras, not a folder): nothing of it was changed (docs/archive.md "Refusals")."""


class ArchiveMismatch(ArchiveError):
    """The archive was written by another model, or holds cameras this node does not have: its
    chunks cannot be recalled here (on the default archive_path it is set aside instead)."""