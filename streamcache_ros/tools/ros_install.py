"""Whether `ros2 launch streamcache_ros ...` / `ros2 run streamcache_ros ...` would run a given checkout.

They need the `ros2` CLI (a system ROS 2, or the wheels scripts/setup.sh installs) and this package
installed the ROS way (colcon: the ament index marker, share/streamcache_ros/launch); with
``--symlink-install`` the installed launch files are links back to the checkout they came from.
"""
from __future__ import annotations

import pathlib
import shutil

PACKAGE = "streamcache_ros"


def ros2_launch_unavailable(checkout: pathlib.Path) -> str:
    """'' when `ros2 launch streamcache_ros live.launch.py` runs ``checkout``'s files, else why not."""
    if shutil.which("ros2") is None:
        return "the ros2 CLI is not installed (no system ROS 2, no ros2 CLI wheels: see docs/setup.md)"
    try:
        import launch_ros  # noqa: F401, PLC0415
    except ModuleNotFoundError as err:
        return f"launch_ros is not installed ({err}; the ros2 CLI wheels bring it, docs/setup.md)"
    from ament_index_python.packages import PackageNotFoundError, get_package_share_directory  # noqa: PLC0415

    try:
        share = pathlib.Path(get_package_share_directory(PACKAGE))
    except PackageNotFoundError as err:  # the one expected absence; anything else is raised
        return f"{PACKAGE} is not installed the ROS way ({err}); scripts/setup.sh builds it with colcon"
    installed = (share / "launch" / "live.launch.py").resolve()
    if installed != (pathlib.Path(checkout) / "launch" / "live.launch.py").resolve():
        return f"the {PACKAGE} in AMENT_PREFIX_PATH is another checkout's ({installed})"
    return ""
