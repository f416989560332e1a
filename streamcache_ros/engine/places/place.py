"""Places a question can be limited to: a point and a radius in the pose frame, or a name from the
node's places file (docs/places.md "Questions limited to a place")."""
from __future__ import annotations

import math
import pathlib
from dataclasses import dataclass

import numpy as np

from ..errors import QuestionError


class PlaceError(QuestionError):
    """A place that cannot be read: unknown name, bad radius, or never visited."""


@dataclass(frozen=True)
class Place:
    """A disc on the floor: ``radius`` metres around (x, y) in ``frame_id`` (empty: the pose source's)."""

    x: float
    y: float
    radius: float
    name: str = ""
    frame_id: str = ""

    def describe(self) -> str:
        where = f"within {self.radius:g} m of ({self.x:g}, {self.y:g})"
        return f"'{self.name}' ({where})" if self.name else where

    def contains(self, xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
        return np.hypot(np.asarray(xs, float) - self.x, np.asarray(ys, float) - self.y) <= self.radius


def load_places(path: str | pathlib.Path) -> dict[str, Place]:
    """The named places of a YAML file: ``frame_id: map`` and ``places: {name: {x:, y:, radius:}}``.
    ValueError naming what is wrong (the node refuses to start on it, as on a bad parameter)."""
    import yaml

    path = pathlib.Path(path)
    if not path.is_file():
        raise ValueError(f"places_file {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as error:
        raise ValueError(f"places_file {path} is not YAML: {error}") from None
    if not isinstance(data, dict) or not isinstance(data.get("places"), dict):
        raise ValueError(f"places_file {path} needs a 'places:' mapping of name -> {{x, y, radius}}")
    frame_id = str(data.get("frame_id", "") or "")
    places = {}
    for name, spec in data["places"].items():
        try:
            x, y, radius = float(spec["x"]), float(spec["y"]), float(spec.get("radius", 1.0))
        except (TypeError, KeyError, ValueError):
            raise ValueError(f"places_file {path}: place '{name}' needs numbers x, y (and radius)") from None
        if not (math.isfinite(x) and math.isfinite(y) and math.isfinite(radius)) or radius <= 0:
            raise ValueError(f"places_file {path}: place '{name}' needs finite x, y and a radius > 0")
        places[str(name)] = Place(x, y, radius, str(name), frame_id)
    return places


def resolve_place(name: str, center: tuple[float, float] | None, radius: float,
                  named: dict[str, Place]) -> Place | None:
    """The place a request names: None for none (empty name, radius 0); PlaceError for a name the
    places file lacks or a radius that is not a positive number."""
    name = (name or "").strip()
    if name:
        if name not in named:
            known = ", ".join(sorted(named)) or "none: set places_file"
            raise PlaceError(f"unknown place '{name}' (named places: {known})")
        return named[name]
    if radius == 0 and (center is None or center == (0.0, 0.0)):
        return None
    if not (math.isfinite(radius) and radius > 0):
        raise PlaceError(f"place_radius must be a number > 0 (metres), got {radius}")
    x, y = center if center is not None else (0.0, 0.0)
    if not (math.isfinite(x) and math.isfinite(y)):
        raise PlaceError(f"place_center must be finite, got ({x}, {y})")
    return Place(float(x), float(y), float(radius))
