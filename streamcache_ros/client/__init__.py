"""Talking to a running streamcache node from Python: the client other nodes and behaviour trees
import, the private rclpy participant it runs on, and the ``streamcache-ask`` CLI."""
from .client import AskGoal, NodeNotConfigured, NodeNotFound, StreamCacheClient, discover_namespace

__all__ = ["AskGoal", "NodeNotConfigured", "NodeNotFound", "StreamCacheClient", "discover_namespace"]
