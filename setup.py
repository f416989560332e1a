"""streamcache_ros: an ament_python package (colcon) that also installs with pip (the venv's bin/)."""
import glob

from setuptools import find_packages, setup

PACKAGE = "streamcache_ros"

setup(
    name=PACKAGE,
    version="0.1.0",
    packages=find_packages(include=[PACKAGE, f"{PACKAGE}.*"]),
    package_data={PACKAGE: ["models/*/*", "models/retrieval/*/*"]},
    data_files=[
        ("share/ament_index/resource_index/packages", [f"resource/{PACKAGE}"]),
        (f"share/{PACKAGE}", ["package.xml"]),
        (f"share/{PACKAGE}/launch", glob.glob("launch/*.launch.py")),
        (f"share/{PACKAGE}/config", glob.glob("config/*.yaml") + glob.glob("config/*.xml")),
    ],
    install_requires=["setuptools"],
    zip_safe=False,
    maintainer="streamcache_ros developers",
    maintainer_email="streamcache@example.com",
    description="A long visual memory for robots: bounded VLM KV cache over camera streams, ROS 2 QA.",
    license="Apache-2.0",
    entry_points={
        "console_scripts": [
            "streamcache-demo = streamcache_ros.tools.engine_demo:main",
            "streamcache_node = streamcache_ros.node.main:main",
            "streamcache-ask = streamcache_ros.client.ask_cli:main",
            "streamcache-archive = streamcache_ros.tools.archive_cli:main",
            "streamcache-replay = streamcache_ros.tools.replay:main",
            "streamcache-make-bag = streamcache_ros.tools.bagfile:main",
            "streamcache-node-demo = streamcache_ros.tools.demo:main",
            "streamcache-profile = streamcache_ros.tools.profile_heads:main",
            "streamcache-export-encoder = streamcache_ros.tools.export_encoder:main",
        ],
    },
)
