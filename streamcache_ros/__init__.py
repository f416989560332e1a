"""streamcache_ros: a long visual memory for robots (VLM KV cache kept bounded, ROS 2 node)."""

__version__ = "0.1.0"
