"""The ROS 2 face of the engine (rclpy lives here and nowhere below).

Flow of a frame: camera topic -> image_conversion (validate, RGB) -> sampler (stamp-based sampling,
latest-frame slot, drop counting) -> ingest thread -> engine Session -> MemoryStatus / diagnostics.
"""
