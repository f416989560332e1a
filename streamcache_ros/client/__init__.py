"""Talking to a running streamcache node from Python: the client other nodes and behaviour trees
import, the private rclpy participant it runs on, and the ``streamcache-ask`` CLI."""
from .client import (AskGoal, EvidenceImage, NodeNotConfigured, NodeNotFound, StreamCacheClient, discover_namespace,
                     evidence_images)

__all__ = ["AskGoal", "EvidenceImage", "NodeNotConfigured", "NodeNotFound", "StreamCacheClient", "discover_namespace",
           "evidence_images"]
