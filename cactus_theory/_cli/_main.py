"""The command line's entry point: the parser assembled from the command modules (one module per
command in this package, named as its command: ``ORDER``, ``HELP``, ``EPILOG`` where it has one, ``add_arguments
(parser)`` and ``run(args)``; a new command is a new module; no flag is taken by an abbreviation),
plugins imported first, and every expected failure one line (exit 2 for bad input)."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import pkgutil
import sys

from ._common import _Formatter, _Parser

__all__ = ["build_parser", "commands", "main"]


def commands() -> list:
    """The command modules of this package, in their ``ORDER`` (the order ``--help`` lists them)."""
    package, here = __name__.rpartition(".")[0], os.path.dirname(os.path.abspath(__file__))
    found = [
        importlib.import_module(f"{package}.{info.name}")
        for info in pkgutil.iter_modules([here])
        if not info.name.startswith("_")
    ]
    return sorted(found, key=lambda m: (getattr(m, "ORDER", 100), m.__name__))


def build_parser() -> argparse.ArgumentParser:

    parser = _Parser(
        prog="cactus-theory",
        description="Theory and simulation of speculative-decoding acceptance rules (Cactus, ICLR 2026).",
        formatter_class=_Formatter,
    )
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    parser.add_argument(
        "--plugin",
        action="append",
        metavar="MODULE",
        help="import this module first, so that the rules it defines are registered (repeatable; a module on "
        "the Python path or MODULE.py in the current directory). Installed packages can instead declare the "
        "entry point group 'cactus_theory.rules'",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for module in commands():
        epilog = getattr(module, "EPILOG", None)
        command = sub.add_parser(
            module.__name__.rsplit(".", 1)[-1],
            help=module.HELP,
            epilog=epilog() if callable(epilog) else epilog,
            formatter_class=_Formatter,
        )
        module.add_arguments(command)
    return parser


def _explain(exc: BaseException, flags=None):
    """(exit code, one line) for an expected failure: 2 for bad arguments or input, 1 for the rest. ``flags``: the
    command's words for the library's settings ({setting: flag}; a ``SettingError`` of one is said with it)."""
    flags = flags or {}
    from .._data._trace_format import TraceError
    from .._servers._protocol import ProtocolPluginError
    from .._util._isolation import IsolationUnavailable

    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    setting = getattr(exc, "setting", None)
    if setting is not None and setting in flags:  # a library setting's refusal, in the command's own words
        first = f"{flags[setting]}: {exc.why}"
    if isinstance(exc, (IsolationUnavailable, ProtocolPluginError)):  # the machine or a plugin, not the input
        return 1, first
    if isinstance(exc, (ValueError, TraceError, TypeError)):
        return 2, first
    if isinstance(exc, ConnectionError):  # a scheduler that does not answer: the message says what to do
        return 1, first
    if isinstance(exc, OSError):
        what = exc.strerror or first
        where = f": {exc.filename}" if exc.filename else ""
        hint = {
            FileNotFoundError: "check the path",
            PermissionError: "choose a directory you can write to",
            NotADirectoryError: "a parent of that path is a file",
            IsADirectoryError: "give a file, not a directory",
        }.get(type(exc), "check the path and the disk")
        return 1, f"{what}{where} ({hint})"
    if isinstance(exc, ImportError):
        if "pip install" in first:
            return 1, first
        return 1, f"{first}: install the models extra, pip install 'cactus_theory[models]'"
    return 1, f"{type(exc).__name__}: {first} (run with --debug for the traceback)"


def _take_plugins(argv):
    """(the --plugin modules, argv without them): taken out wherever they stand, so that the
    rules they register are known before the parser lists the rules in its help."""
    modules, rest, items = [], [], list(argv)
    i = 0
    while i < len(items):
        item = items[i]
        if item == "--plugin" and i + 1 < len(items):
            modules.append(items[i + 1])
            i += 2
            continue
        if item.startswith("--plugin="):
            modules.append(item.split("=", 1)[1])
        else:
            rest.append(item)
        i += 1
    return modules, rest


def import_plugin(name: str):
    """Import a plugin module by name (or a path to a .py file); the current directory (or the
    file's) is put on the Python path, for this process and the worker processes it starts."""
    import importlib

    directory = os.getcwd()
    if name.endswith(".py"):
        directory, name = os.path.dirname(os.path.abspath(name)), os.path.basename(name)[:-3]
    if not name.replace(".", "").replace("_", "").isalnum():
        raise ValueError(f"--plugin {name!r} is not a module name (e.g. my_rules, or my_rules.py)")
    if directory not in sys.path:
        sys.path.insert(0, directory)
        parts = [directory, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        os.environ["PYTHONPATH"] = os.pathsep.join(parts)  # Dask workers start fresh interpreters
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name == name.split(".")[0]:
            raise ValueError(
                f"--plugin {name!r}: no module named {name!r} (put {name}.py in the current directory or its package "
                "on PYTHONPATH)"
            ) from None
        raise


def _plugin_problems(modules, report=True) -> None:
    """Refuse a --plugin module whose rule classes cannot be used (a parameter without a default);
    warn, one line each, about entry-point plugins that failed to import (their rules are
    unavailable; every other command works). Rule warnings are then silenced for the process, so
    each is said once, the same way every time."""
    import warnings

    from .._rules import RulePluginWarning, available_rules, plugin_errors
    from .._rules._registry import rule_classes

    names = {m.__name__ for m in modules}
    for key, line in plugin_errors().items():
        cls = rule_classes(plugins=False).get(key, (None,))[0]
        if cls is not None and cls.__module__ in names:
            raise ValueError(f"--plugin {cls.__module__}: {line}")
        if report:
            print(f"cactus-theory: warning: {line}", file=sys.stderr)
    warnings.simplefilter("ignore", RulePluginWarning)
    available_rules()  # listed once here; the warnings above stand for every later listing


def main(argv=None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    plugins, argv = _take_plugins(given)
    try:
        modules = [import_plugin(name) for name in plugins]
        command = next((a for a in argv if not a.startswith("-")), None)
        _plugin_problems(modules, report=command != "gamma")  # gamma is the one command without rules
    except Exception as exc:
        if "--debug" in argv:
            raise
        code, line = _explain(exc)
        print(f"cactus-theory: error: {line}", file=sys.stderr)
        return code
    parser = build_parser()
    args = parser.parse_args(argv)
    args.command_line = given  # every argument as given, plugins included: what a written page names
    try:
        return args.func(args)
    except BrokenPipeError:  # the reader went away (| head): stop quietly, as Unix tools do
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return 141
    except KeyboardInterrupt:
        if args.debug:
            raise
        print("cactus-theory: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if args.debug:
            raise
        flags = dict(getattr(sys.modules.get(args.func.__module__), "FLAGS", {}))
        if hasattr(args, "llama_context"):  # the --context the shared model options add
            flags["context"] = "--context"
        code, line = _explain(exc, flags)
        print(f"cactus-theory: error: {line}", file=sys.stderr)
        return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
