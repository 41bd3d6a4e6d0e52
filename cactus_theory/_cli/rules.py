"""``cactus-theory rules``: every registered rule with its parameters and defaults.
Its arguments, then the code that runs them."""

from __future__ import annotations

import json

ORDER = 1
HELP = "list the registered acceptance rules with their parameters and defaults"


def add_arguments(rl):
    """This command's arguments (``_main`` makes its subparser: its name, ``HELP``, ``EPILOG``)."""
    rl.add_argument("--json", action="store_true", help="print JSON instead of a table")
    rl.set_defaults(func=run)
    return rl


def run(args) -> int:
    from .._rules import available_rules

    infos = available_rules()
    if args.json:
        print(
            json.dumps(
                {
                    name: {
                        "parameters": {k: _jsonable(v) for k, v in i.parameters.items()},
                        "fixed": i.fixed,
                        "summary": i.summary,
                        "reference": i.reference,
                        "module": i.rule_class.__module__,
                    }
                    for name, i in infos.items()
                },
                indent=1,
            )
        )
        return 0
    width = max(len(i.signature()) for i in infos.values())
    for info in infos.values():
        origin = "" if info.builtin else f" [plugin {info.rule_class.__module__}]"
        print(f"{info.signature():<{width}}  {info.summary}{origin}")
    return 0


def _jsonable(value):
    return list(value) if isinstance(value, tuple) else value
