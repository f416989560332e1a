"""Where: the robot's pose at every frame, and places a question can be limited to (docs/places.md).

No ROS here: the node feeds poses in (from an odometry / pose topic, or TF), the archive keeps one
per frame, and a question's place becomes the time spans the robot spent inside it."""
from .pose import Pose, PoseTrack, restored_poses, snapshot_poses
from .place import Place, PlaceError, load_places

__all__ = ["Pose", "PoseTrack", "restored_poses", "snapshot_poses", "Place", "PlaceError", "load_places"]
