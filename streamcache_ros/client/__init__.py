"""Talking to a running streamcache node from Python: the client other nodes and behaviour trees
import, the private rclpy participant it runs on, the fleet (every node at once) and the
``streamcache-ask`` CLI."""
from .client import (AskGoal, EvidenceImage, NodeNotConfigured, NodeNotFound, StreamCacheClient, discover_namespace,
                     evidence_images)
from .fleet import FleetAnswer, FleetEntry, ask_fleet, find_nodes

__all__ = ["AskGoal", "EvidenceImage", "FleetAnswer", "FleetEntry", "NodeNotConfigured", "NodeNotFound",
           "StreamCacheClient", "ask_fleet", "discover_namespace", "evidence_images", "find_nodes"]
