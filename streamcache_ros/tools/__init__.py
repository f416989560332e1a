"""Command-line tools that use the engine (no ROS)."""
