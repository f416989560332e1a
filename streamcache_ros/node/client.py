"""Kept importable for other people's nodes: the client now lives in ``streamcache_ros.client``."""
from ..client.client import (AskGoal, MemoryStatusWatch, NodeNotFound, StreamCacheClient,  # noqa: F401
                             discover_namespace, find_namespaces)
