"""Policy settings as dataclasses: one per policy, each field saying what it means.

As kvpress does with its presses, a policy's knobs are the fields of a small dataclass. Each field
is made with ``setting(...)``: its default, a description, its range or choices, the old names it
still answers to, and its scope. Everything else is generated from them: the checks (here, once),
the node's ROS parameter descriptors (node/params.py), the list of a policy's parameters.

Scopes: ``policy`` fields are the node's parameters ``<policy>.<name>``; ``inherited`` ones too, but
their default is the general parameter of the same name (``reindex: eager`` applies to every
policy, ``hermes.reindex: eager`` to hermes alone); a ``general`` field is the general parameter
itself (``budget_tokens``): a policy takes a token budget when its settings have that field.

A field made with ``preset=True`` is left empty by default and filled from the model family's
preset (``FamilyTraits.presets``, given by the adapter) when the policy is set up, or from
``fallback`` where the family has none.
"""
from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

POLICY, INHERITED, GENERAL = "policy", "inherited", "general"


class SettingError(ValueError):
    """A setting has a value that cannot work; ``name`` is the setting (or the old name) given."""

    def __init__(self, name: str, message: str):
        super().__init__(f"{name} {message}")
        self.name = name


def setting(default: Any, description: str, *, low: float | None = None, high: float | None = None,
            choices: tuple[str, ...] = (), aliases: tuple[str, ...] = (), scope: str = POLICY,
            preset: bool = False, fallback: Any = None):
    """A settings field. ``low``/``high``: an inclusive range; ``choices``: the allowed strings;
    ``aliases``: old names that still set it."""
    meta = {"description": description, "low": low, "high": high, "choices": tuple(choices),
            "aliases": tuple(aliases), "scope": scope, "preset": preset, "fallback": fallback}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class SettingInfo:
    """One field of a policy's settings, as the node declares it and the checks read it."""

    name: str
    default: Any
    description: str
    low: float | None
    high: float | None
    choices: tuple[str, ...]
    aliases: tuple[str, ...]
    scope: str
    preset: bool
    fallback: Any


def _default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def _coerce(info: SettingInfo, value: Any) -> Any:
    """The value in the default's type: ROS gives an int where a float is meant, tuples, numpy
    arrays for lists, and None for a list declared empty."""
    default = info.default
    if value is None:
        return copy.deepcopy(default)
    if isinstance(default, bool):
        return bool(value)
    if isinstance(default, int):
        return int(value)
    if isinstance(default, float):
        return float(value)
    if isinstance(default, str):
        return str(value)
    if isinstance(default, list):
        return [float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v for v in value]
    return value


def _check_value(info: SettingInfo, value: Any) -> None:
    if info.choices and value not in info.choices:
        raise SettingError(info.name, f"must be one of {', '.join(info.choices)}; got '{value}'")
    if info.low is not None and info.high is not None and not info.low <= value <= info.high:
        raise SettingError(info.name, f"must be in [{info.low}, {info.high}], got {value}")
    if info.low is not None and info.high is None and value < info.low:
        raise SettingError(info.name, f"must be >= {info.low}, got {value}")


@dataclass(frozen=True)
class PolicySettings:
    """Base of every policy's settings dataclass (no fields of its own)."""

    def __post_init__(self):
        for info in self.infos():
            value = _coerce(info, getattr(self, info.name))
            object.__setattr__(self, info.name, value)
        self.validate()  # checks between fields (and messages of their own) first
        for info in self.infos():
            if not (info.preset and getattr(self, info.name) in ([], "")):
                _check_value(info, getattr(self, info.name))

    def validate(self) -> None:
        """Checks a field's metadata cannot say (between fields, the shape of a list)."""

    # -- what the fields are --------------------------------------------------------------------
    @classmethod
    def infos(cls) -> list[SettingInfo]:
        return [SettingInfo(f.name, _default(f), f.metadata.get("description", ""), f.metadata.get("low"),
                            f.metadata.get("high"), f.metadata.get("choices", ()), f.metadata.get("aliases", ()),
                            f.metadata.get("scope", POLICY), f.metadata.get("preset", False),
                            f.metadata.get("fallback")) for f in dataclasses.fields(cls)]

    @classmethod
    def takes(cls, name: str) -> bool:
        return any(info.name == name for info in cls.infos())

    @classmethod
    def aliases(cls) -> dict[str, str]:
        """Old name -> the field it sets."""
        return {alias: info.name for info in cls.infos() for alias in info.aliases}

    # -- making one ---------------------------------------------------------------------------------
    @classmethod
    def from_params(cls, params: Mapping[str, Any], extra_aliases: Mapping[str, tuple[str, Any]] | None = None,
                    ignore: tuple[str, ...] = ()) -> "PolicySettings":
        """Settings from flat parameters (names without the policy's prefix). Old names are
        resolved (``extra_aliases``: old name -> (field, the old name's default), e.g. a model
        family's own names); general parameters the policy does not take and names in ``ignore``
        are passed over; any other unknown name is an error."""
        infos = {info.name: info for info in cls.infos()}
        table = {alias: (target, infos[target].default) for alias, target in cls.aliases().items()}
        table.update(extra_aliases or {})
        values, sources = resolve_aliases(dict(params), table, {n: i.default for n, i in infos.items()})
        unknown = sorted(set(values) - set(infos) - set(GENERAL_NAMES) - set(ignore))
        if unknown:
            raise SettingError(unknown[0], f"is not a setting of this policy (settings: {', '.join(infos)})")
        try:
            return cls(**{name: value for name, value in values.items() if name in infos})
        except SettingError as err:
            if err.name in sources:  # say it with the name the caller used
                alias = sources[err.name]
                raise SettingError(f"{alias} (now {err.name})", str(err)[len(err.name) + 1:]) from None
            raise

    def with_preset(self, preset: Mapping[str, Any]) -> "PolicySettings":
        """Empty ``preset=True`` fields filled from a model family's preset (or their fallback)."""
        changes = {}
        for info in self.infos():
            if info.preset and getattr(self, info.name) in ([], ""):
                value = preset.get(info.name, info.fallback)
                changes[info.name] = list(value) if isinstance(value, tuple) else value
        return dataclasses.replace(self, **changes) if changes else self

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# the general parameters a policy's settings may take (scopes ``general`` and ``inherited``)
GENERAL_NAMES = ("budget_tokens", "camera_budget_share", "instant_frames", "reindex", "reindex_margin")


def resolve_aliases(params: dict[str, Any], table: Mapping[str, tuple[str, Any]],
                    defaults: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """Replace old names by the fields they set. An old name counts when its value differs from its
    own default (the node declares every old name, so each always has a value): it then sets the
    field, unless the field was also given a value of its own that differs (an error naming both).
    Returns (parameters, {field: the old name that set it})."""
    out = {name: value for name, value in params.items() if name not in table}
    sources: dict[str, str] = {}
    for alias, (target, alias_default) in table.items():
        if alias not in params or _same(params[alias], alias_default):
            continue
        value = params[alias]
        if target in out and not _same(out[target], defaults.get(target)) and not _same(out[target], value):
            raise SettingError(alias, f"({value!r}) and {target} ({out[target]!r}) are both set and differ: "
                                      f"{alias} is the old name of {target}, give one")
        out[target] = value
        sources[target] = alias
    return out, sources


def _same(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is b or a in ([], "") or b in ([], "")
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        try:
            return [float(x) for x in a] == [float(x) for x in b]
        except (TypeError, ValueError):
            return list(a) == list(b)
    return a == b
