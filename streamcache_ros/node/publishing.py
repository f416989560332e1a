"""Publishing that never raises: every part of the node publishes through it."""
from __future__ import annotations


def publish_quietly(publisher, msg) -> None:
    """Publish ``msg`` unless ``publisher`` is gone; a context shutting down (SIGINT) has nothing to tell."""
    if publisher is None:
        return
    try:
        publisher.publish(msg)
    except Exception:  # noqa: BLE001 - the context is shutting down
        pass
