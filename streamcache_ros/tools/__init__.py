"""Command-line tools that use the engine (no ROS), and the process helpers the tests and the benchmarks
share (processes.py)."""
