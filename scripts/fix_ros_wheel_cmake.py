"""Point the ROS 2 PyPI wheels' exported CMake targets at this interpreter's include dirs.

The wheels were built on a machine whose Python lived in /opt/python/cp311-cp311; their
``*__rosidl_generator_pyExport.cmake`` files name that machine's Python and numpy include
directories, and CMake stops with "includes non-existent path". Idempotent.
"""
import pathlib
import sys
import sysconfig

import numpy

BUILD_MACHINE_PY_INCLUDE = "/opt/python/cp311-cp311/include/python3.11"
BUILD_MACHINE_NUMPY_INCLUDE = "/opt/python/cp311-cp311/lib/python3.11/site-packages/numpy/_core/include"


def main() -> int:
    share = pathlib.Path(sys.prefix) / "share"
    replacements = {
        BUILD_MACHINE_PY_INCLUDE: sysconfig.get_paths()["include"],
        BUILD_MACHINE_NUMPY_INCLUDE: numpy.get_include(),
    }
    fixed = 0
    for path in share.glob("*/cmake/*Export*.cmake"):
        text = path.read_text()
        new_text = text
        for old, new in replacements.items():
            new_text = new_text.replace(old, new)
        if new_text != text:
            path.write_text(new_text)
            fixed += 1
    print(f"[setup] fixed include paths in {fixed} exported CMake target file(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
