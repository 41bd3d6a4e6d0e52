"""The rule registry: rule classes register themselves under spec names when they are defined;
``make_rule`` builds a rule from a spec string ``name(key=value, ...)``; ``available_rules``
lists them. Rules defined outside the package register the same way (subclass ``Rule`` and give
it a ``name``), and modules named in the entry point group ``cactus_theory.rules`` of any
installed distribution are imported the first time the registry is read, so their rules are
listed and built like ours.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import typing
from dataclasses import dataclass

from . import _spec as grammar
from ._protocol import Rule, on_rule_defined

__all__ = [
    "ENTRY_POINT_GROUP",
    "RuleInfo",
    "RulePluginWarning",
    "as_rule",
    "available_rules",
    "load_plugins",
    "make_rule",
    "make_rules",
    "plugin_errors",
    "rule_classes",
]

#: The entry point group a distribution uses to add rules: ``[project.entry-points."cactus_theory.rules"]``
#: ``my_rules = "my_package.my_rules"`` (the module is imported; its rule classes register themselves).
ENTRY_POINT_GROUP = "cactus_theory.rules"
_PLUGINS_LOADED = False
#: Entry-point plugins that failed to import: {entry point name: one line saying why}.
_PLUGIN_ERRORS: dict[str, str] = {}


class RulePluginWarning(UserWarning):
    """A rule plugin (an entry point of ``cactus_theory.rules``) failed to import, or a registered
    rule class cannot be listed: its rules are unavailable; everything else works."""


def load_plugins() -> list[str]:
    """Import the modules of the ``cactus_theory.rules`` entry point group (once); returns their
    names. A module that fails to import does not stop the others: it is recorded
    (``plugin_errors``), and every listing of the rules (``available_rules``) warns about it with
    the same line (``RulePluginWarning``), every time; ``make_rule`` of a name it might have
    defined says so."""
    global _PLUGINS_LOADED
    if _PLUGINS_LOADED:
        return []
    _PLUGINS_LOADED = True
    from importlib import metadata

    try:
        points = metadata.entry_points(group=ENTRY_POINT_GROUP)
    except TypeError:  # pragma: no cover - Python < 3.10 API
        points = metadata.entry_points().get(ENTRY_POINT_GROUP, [])
    loaded = []
    for point in points:
        try:
            point.load()
        except Exception as exc:
            detail = " ".join(str(exc).split())[:200]
            _PLUGIN_ERRORS[point.name] = (
                f"the rule plugin {point.name!r} ({point.value}, entry point group {ENTRY_POINT_GROUP!r}) failed to "
                f"import ({type(exc).__name__}: {detail}): its rules are unavailable; fix or uninstall it"
            )
            continue
        loaded.append(point.value)
    return loaded


def plugin_errors() -> dict[str, str]:
    """{entry point or rule name: one line} for every plugin that failed to import and every
    registered rule class that cannot be listed (a parameter without a default)."""
    load_plugins()
    out = dict(_PLUGIN_ERRORS)
    for name, (cls, fixed) in sorted(_REGISTRY.items()):
        problem = _class_problem(cls, fixed)
        if problem:
            out[name] = f"rule {name!r} ({cls.__module__}.{cls.__qualname__}) cannot be used: {problem}"
    return out


def _warn_plugin_errors():
    import warnings

    for line in plugin_errors().values():
        warnings.warn(line, RulePluginWarning, stacklevel=3)


_REGISTRY: dict[str, tuple[type, dict]] = {}
#: Names registered while the package's own rule modules were imported: never taken by another class.
_BUILTIN: set[str] = set()
_LOADING_BUILTINS = False


class builtin_registration:
    """Within the block, registrations are the package's own (``_rules/__init__`` imports its rule
    modules inside it): their names are built-in, whatever a later class claims about its module."""

    def __enter__(self):
        global _LOADING_BUILTINS
        _LOADING_BUILTINS = True

    def __exit__(self, *exc):
        global _LOADING_BUILTINS
        _LOADING_BUILTINS = False


def _register(name: str, cls: type, fixed: dict):
    if not re.fullmatch(r"[a-z][a-z0-9-]*", name):
        raise ValueError(f"rule name {name!r} must be lower case letters, digits and '-'")
    old = _REGISTRY.get(name)
    if old is not None and old[0] is not cls:
        builtin = name in _BUILTIN and not _LOADING_BUILTINS
        same_place = (old[0].__module__, old[0].__qualname__) == (cls.__module__, cls.__qualname__)
        if builtin or not same_place:  # a plugin module imported again may re-register its own class
            kind = "a built-in rule" if name in _BUILTIN else "a rule"
            raise ValueError(
                f"rule name {name!r} is taken by {kind}, {old[0].__module__}.{old[0].__qualname__}: give "
                f"{cls.__qualname__} another name"
            )
    _REGISTRY[name] = (cls, dict(fixed))
    if _LOADING_BUILTINS:
        _BUILTIN.add(name)


def _class_problem(cls, fixed) -> str | None:
    """Why a registered class cannot be listed or built from a spec (None when it can)."""
    if not dataclasses.is_dataclass(cls):
        return "it is not a dataclass: decorate it with @dataclass(frozen=True)"
    for f in grammar.fields(cls):
        if f.name not in fixed and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            return f"its parameter {f.name!r} has no default: give every rule parameter a default"
    return None


@dataclass(frozen=True)
class RuleInfo:
    """A registered rule: its spec name, class, parameters with defaults, fixed parameters (an
    alias such as ``cactus-exact`` fixes ``bonus="exact"``), one-line summary, reference, the
    cells of the rules table, and whether it comes from this package or a plugin."""

    name: str
    rule_class: type
    parameters: dict
    fixed: dict
    summary: str
    reference: str = ""
    table: dict = dataclasses.field(default_factory=dict)
    builtin: bool = True

    def signature(self) -> str:
        """``name(param=default, ...)`` as a spec string would write it."""
        args = ", ".join(f"{k}={grammar.format_value(v)}" for k, v in self.parameters.items())
        return f"{self.name}({args})" if args else self.name


def available_rules() -> dict[str, RuleInfo]:
    """Every registered rule by spec name (sorted), with its parameters and their defaults
    (plugins of the ``cactus_theory.rules`` entry point group included).

    Examples
    --------
    >>> info = available_rules()["rfsd"]
    >>> info.signature()
    'rfsd(divergence=js, threshold=0.2)'
    """
    load_plugins()
    _warn_plugin_errors()
    out = {}
    for name in sorted(_REGISTRY):
        cls, fixed = _REGISTRY[name]
        if _class_problem(cls, fixed):
            continue  # warned above: a class that cannot be built from a spec is not listed
        params = {f.name: grammar.default(f) for f in grammar.fields(cls) if f.name not in fixed}
        summary = getattr(cls, "alias_summaries", {}).get(name) or _first_sentence(cls.__doc__)
        table = getattr(cls, "alias_tables", {}).get(name) or getattr(cls, "table", {})
        out[name] = RuleInfo(
            name,
            cls,
            params,
            dict(fixed),
            summary,
            reference=getattr(cls, "reference", ""),
            table=dict(table),
            builtin=name in _BUILTIN,
        )
    return out


def rule_classes(plugins=True) -> dict:
    """Every registered spec name (sorted) with its (class, fixed parameters): an alias shares its
    class and fixes some of its parameters. ``plugins``: load the entry-point plugins first."""
    if plugins:
        load_plugins()
    return {name: _REGISTRY[name] for name in sorted(_REGISTRY)}


def _first_sentence(doc) -> str:
    """The first paragraph of a docstring on one line (a summary may wrap over lines)."""
    first = (doc or "").strip().split("\n\n")[0]
    return " ".join(first.split())


@functools.cache
def _hints(cls) -> dict:
    """A rule class's field type hints (typing.get_type_hints is slow: once per class)."""
    return typing.get_type_hints(cls)


def _register_class(cls) -> None:
    """Register a named rule class under its name and aliases (``Rule`` announces each one)."""
    _register(cls.__dict__["name"], cls, {})
    for alias, fixed in cls.__dict__.get("aliases", {}).items():
        _register(alias, cls, fixed)


def is_rule(obj) -> bool:
    """Whether ``obj`` is a rule object (an instance of ``Rule``)."""
    return isinstance(obj, Rule)


def as_rule(rule) -> Rule:
    """A rule from a Rule, a spec string (``make_rule``) or an object implementing the protocol."""
    if isinstance(rule, Rule):
        return rule
    if isinstance(rule, str):
        return make_rule(rule)
    missing = [
        m for m in ("acceptance", "correction", "bonus_distribution", "emitted") if not callable(getattr(rule, m, None))
    ]
    if missing:
        raise ValueError(
            f"rule must implement acceptance, correction, bonus_distribution and emitted; {rule!r} lacks {missing}"
        )
    return rule


def make_rule(spec) -> Rule:
    """A rule from a spec string ``name(key=value, ...)``, e.g. ``cactus(delta=1)``,
    ``topk(k=3)``, ``rfsd(divergence=js, threshold=0.2)``; a Rule is returned as it is.

    Values are coerced to the parameter's type; lists are written ``[0.9; 0.6; 0.3]``. An
    unknown name or parameter raises a ValueError that lists the valid ones
    (``available_rules()``).

    Examples
    --------
    >>> make_rule("cactus(delta=0.5)")
    Cactus(delta=0.5, divergence='kl', bonus='taylor')
    >>> make_rule("lossy(alpha=0.7)").describe()
    'lossy(alpha=0.7)'
    """
    if is_rule(spec):
        return spec
    if not isinstance(spec, str):
        raise ValueError(f"a rule spec must be a string like 'cactus(delta=1)' or a Rule; got {grammar.quote(spec)}")
    name, args = grammar.parse_spec(spec)
    if name not in _REGISTRY:
        load_plugins()
    if name not in _REGISTRY:
        names = ", ".join(sorted(_REGISTRY))
        failed = "".join(f"; {line}" for line in _PLUGIN_ERRORS.values())
        raise ValueError(
            f"unknown rule {grammar.quote(name)} in {grammar.quote(spec)}; registered rules: {names}{failed}"
        )
    cls, fixed = _REGISTRY[name]
    problem = _class_problem(cls, fixed)
    if problem:
        raise ValueError(f"rule {name!r} ({cls.__module__}.{cls.__qualname__}) cannot be built: {problem}")
    hints = _hints(cls)
    allowed = [f.name for f in grammar.fields(cls) if f.name not in fixed]
    kwargs = dict(fixed)
    for key, raw in args.items():
        if key not in allowed:
            valid = ", ".join(allowed) if allowed else "none"
            raise ValueError(
                f"rule {name!r} has no parameter {grammar.quote(key)} (in {grammar.quote(spec)}); its parameters: "
                f"{valid}"
            )
        kwargs[key] = grammar.coerce(raw, hints.get(key, str), key, spec)
    return cls(**kwargs)


def make_rules(specs, grid=None) -> list[Rule]:
    """Rules from specs (a list, or one string of comma-separated specs), expanded over a grid.

    ``grid`` maps a parameter to values, e.g. ``{"delta": [0.25, 1]}``: every spec whose rule
    takes that parameter from a grid (its class lists it in ``grid_parameters``: Cactus's and
    mentored decoding's divergence budget ``delta``, not relaxed-topk's probability gap of the
    same name) and does not set it is built once per value (``--rules cactus,mentored --delta
    0.25,1``). Specs that set it, and rules without it, are built once.

    Examples
    --------
    >>> [r.describe() for r in make_rules("sps,cactus,lossy(alpha=0.3)", {"delta": [0.25, 1]})]
    ['sps', 'cactus(delta=0.25)', 'cactus(delta=1)', 'lossy(alpha=0.3)']
    """
    if isinstance(specs, str):
        specs = grammar.split_top(specs, ",")
    specs = [s for s in specs if not (isinstance(s, str) and not s.strip())]
    if not specs:
        raise ValueError(f"no rules given; choose from {', '.join(sorted(_REGISTRY))}")
    grid = {k: list(v) for k, v in (grid or {}).items()}
    rules = []
    for spec in specs:
        if is_rule(spec):
            rules.append(spec)
            continue
        name, args = grammar.parse_spec(spec)
        if name not in _REGISTRY:
            make_rule(spec)  # raises with the list of names
        cls, fixed = _REGISTRY[name]
        fields = {f.name for f in grammar.fields(cls)} - set(fixed) - set(args)
        fields &= set(getattr(cls, "grid_parameters", ()))  # a grid value only where it means the same
        expand = [(k, v) for k, v in grid.items() if k in fields]
        combos = [{}]
        for key, values in expand:
            combos = [{**c, key: v} for c in combos for v in values]
        for combo in combos:
            rule = make_rule(spec)
            rules.append(dataclasses.replace(rule, **combo) if combo else rule)
    return rules


on_rule_defined(_register_class)  # every named Rule subclass, defined already or later, registers
