"""How far an index's scores can be trusted: its threshold measured on frames whose truth is known
(docs/archive.md "Calibrating the index").

    cosines = frame_vectors @ text_vectors.T          # [frames, texts]
    mine = check(cosines, truth, threshold_cosine)     # what the encoder's own threshold keeps
    fitted = fit(cosines, truth)                       # the threshold that keeps RECALL_TARGET

A dual encoder's scale and bias are what turn a cosine into P(yes); a CLIP checkpoint has no bias
for that, a SigLIP one was trained on other pictures, and a bias or temperature set wrong puts the
threshold anywhere. So the node checks every encoder, when it loads it, on a calibration set it
ships: shape-world frames with which identities each shows. The threshold is where the encoder
keeps RECALL_TARGET of the frames that show what is asked; it is *trusted* when, there, it also lets
at most FALSE_YES_LIMIT of the others through and keeps WORST_RECALL of every identity's frames.
An untrusted index still ranks, but its "nothing here" is not taken as an answer (questions/moment.py).
Plain functions on arrays: no model.
"""
from __future__ import annotations

import io
import pathlib
import dataclasses
from dataclasses import asdict, dataclass

import numpy as np

CALIBRATION_FILE = "shape-world-calibration.npz"
RECALL_TARGET = 0.98  # of the frames that show what is asked, the share the threshold keeps
FALSE_YES_LIMIT = 0.05  # of the frames that do not, the share it may let through and be trusted
WORST_RECALL = 0.9  # every identity's own recall at the threshold, for it to be trusted
P_AT_THRESHOLD = 0.5  # the threshold is where P(yes) crosses this
NEGATIVES_BELOW = 0.995  # a fitted threshold lies above this share of the others' cosines (when it can)


@dataclass(frozen=True)
class Calibration:
    """An index's threshold and how it did on the calibration set."""

    threshold: float  # the cosine at which a frame becomes a candidate
    slope: float  # P(yes) = sigmoid(slope * (cosine - threshold))
    recall: float  # of the frames showing the asked identity, the share at or above the threshold
    false_yes: float  # of the frames not showing it, the share at or above the threshold
    worst_recall: float  # the lowest recall of any one identity
    frames: int  # frames of the calibration set
    source: str  # "own" (the encoder's scale and bias kept) | "fitted"
    replaced: str = ""  # fitted: what the encoder's own numbers did on the set (``describe``)

    @property
    def trusted(self) -> bool:
        return (self.recall >= RECALL_TARGET and self.false_yes <= FALSE_YES_LIMIT
                and self.worst_recall >= WORST_RECALL)

    @property
    def bias(self) -> float:
        """The bias that puts P(yes) = P_AT_THRESHOLD at the threshold, with ``slope`` as the scale."""
        return float(np.log(P_AT_THRESHOLD / (1 - P_AT_THRESHOLD)) - self.slope * self.threshold)

    def describe(self) -> str:
        return (f"recall {self.recall:.2f} (worst identity {self.worst_recall:.2f}), false yes {self.false_yes:.3f} "
                f"at cosine {self.threshold:.3f} on {self.frames} calibration frames")

    def to_dict(self) -> dict:
        return asdict(self)


def check(cosines: np.ndarray, truth: np.ndarray, threshold: float) -> tuple[float, float, float]:
    """(recall, false yes, worst identity's recall) of ``threshold`` (a cosine) over ``cosines``
    [frames, texts] against ``truth`` [frames, texts] (bool: the frame shows what the text names)."""
    said = cosines >= threshold
    recall = float(said[truth].mean()) if truth.any() else 0.0
    false_yes = float(said[~truth].mean()) if (~truth).any() else 0.0
    shown = truth.any(axis=0)
    per_text = [float(said[:, j][truth[:, j]].mean()) for j in np.flatnonzero(shown)]
    return recall, false_yes, min(per_text, default=0.0)


def fit(cosines: np.ndarray, truth: np.ndarray, source: str = "fitted") -> Calibration:
    """A threshold in the gap between the positives and the negatives: midway between the cosine
    that keeps RECALL_TARGET of the frames showing what is asked and the one that 99.5 % of the
    others stay below (that first cosine when there is no gap); and the slope of a logistic fit of the
    truth on the cosine, so P(yes) means something along the timeline."""
    positives, negatives = cosines[truth], cosines[~truth]
    keeps = float(np.quantile(positives, 1 - RECALL_TARGET, method="lower")) if len(positives) else 1.0
    reached = float(np.quantile(negatives, NEGATIVES_BELOW, method="higher")) if len(negatives) else -1.0
    threshold = (keeps + reached) / 2 if keeps > reached else keeps
    recall, false_yes, worst = check(cosines, truth, threshold)
    return Calibration(threshold, logistic_slope(cosines.ravel(), truth.ravel()), recall, false_yes, worst,
                       int(cosines.shape[0]), source)


def logistic_slope(x: np.ndarray, y: np.ndarray, steps: int = 25) -> float:
    """The slope of a one-feature logistic regression of ``y`` on ``x`` (Newton's method, a little
    ridge so separable data stays finite); at least 1."""
    x = np.asarray(x, np.float64)
    y = np.asarray(y, np.float64)
    scale = x.std() or 1.0
    z = (x - x.mean()) / scale
    a = b = 0.0
    for _ in range(steps):
        p = 1.0 / (1.0 + np.exp(-np.clip(a * z + b, -60, 60)))
        w = p * (1 - p) + 1e-9
        grad = np.array([np.sum((p - y) * z) + 1e-3 * a, np.sum(p - y)])
        hess = np.array([[np.sum(w * z * z) + 1e-3, np.sum(w * z)], [np.sum(w * z), np.sum(w)]])
        step = np.linalg.solve(hess, grad)
        a, b = a - step[0], b - step[1]
    return max(float(a / scale), 1.0)


def own(cosines: np.ndarray, truth: np.ndarray, threshold: float, slope: float) -> Calibration:
    """What the encoder's own threshold (a cosine) and scale do on the calibration set."""
    recall, false_yes, worst = check(cosines, truth, threshold)
    return Calibration(threshold, slope, recall, false_yes, worst, int(cosines.shape[0]), "own")


def choose(mine: Calibration, fitted: Calibration) -> Calibration:
    """The encoder's own numbers when they are trusted on the calibration set, else the fitted ones
    (trusted or not: the best threshold this encoder has), saying what its own did."""
    return mine if mine.trusted else dataclasses.replace(fitted, replaced=mine.describe())


@dataclass
class CalibrationSet:
    """Frames whose truth is known: ``frames`` RGB uint8, ``truth`` [frames, texts], ``texts``."""

    frames: list[np.ndarray]
    truth: np.ndarray
    texts: list[str]
    name: str

    @classmethod
    def load(cls, path: str | pathlib.Path) -> "CalibrationSet":
        from PIL import Image  # noqa: PLC0415

        data = np.load(path)
        ends = np.cumsum(data["sizes"])
        blob = data["jpegs"]
        frames = [np.asarray(Image.open(io.BytesIO(blob[end - size:end].tobytes())).convert("RGB"))
                  for size, end in zip(data["sizes"], ends)]
        return cls(frames, data["truth"].astype(bool), [str(t) for t in data["texts"]], pathlib.Path(path).name)
