"""One shape for every result a study returns (as scipy.optimize's results share ``OptimizeResult``):
``records()`` (a list of plain dicts, one per row), ``table()`` (fixed-width text), ``markdown()``,
``figure()`` (a matplotlib Figure), ``to_frame()`` (a pandas DataFrame, when pandas is installed)
and ``write(out_dir)`` (``<name>.md``, ``<name>.json``, ``<name>.csv``, ``<name>.png``, atomically,
with the command that reproduces them)."""

from __future__ import annotations

import json
import math
import os

__all__ = ["Result", "RowsResult", "figure_png", "interval", "json_ready"]


def interval(lo, hi, spec=".3f", percent=False) -> str:
    """ "[lo, hi]" formatted with ``spec`` (signed percentages with ``percent``), or "n/a" where the
    interval could not be had (NaN: one sequence, no resamples): never a number it is not."""
    if not (isinstance(lo, (int, float)) and isinstance(hi, (int, float)) and math.isfinite(lo) and math.isfinite(hi)):
        if lo == hi and isinstance(lo, float) and math.isinf(lo):  # an infinite value is its own interval
            return f"[{lo}, {hi}]"
        return "n/a"
    if percent:
        return f"[{lo:+.2%}, {hi:+.2%}]"
    return f"[{lo:{spec}}, {hi:{spec}}]"


def figure_png(fig, dpi=110) -> bytes:
    """PNG bytes of a matplotlib figure, which is then closed."""
    import io

    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    return buf.getvalue()


def json_ready(value):
    """``value`` as the package's JSON holds it: NaN (no value) as null, an infinity as ``Infinity`` (a value: an
    infinite KL is one, as the tables' ``inf`` and the experiments' pages write it), tuples as lists, numpy scalars
    as Python numbers, dict keys as strings."""
    if isinstance(value, float):
        return None if math.isnan(value) else value
    if isinstance(value, dict):
        return {str(k): json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):  # a numpy scalar
        return json_ready(value.item())
    return value


class Result:
    """The protocol of a study's result. Subclasses give ``records`` and ``table``, and usually
    ``markdown`` and ``figure``; ``name`` names the files ``write`` makes."""

    #: The stem of the files ``write`` makes.
    name: str = "result"

    def records(self) -> list:  # pragma: no cover - abstract
        """One plain dict per row."""
        raise NotImplementedError

    def table(self) -> str:  # pragma: no cover - abstract
        """The rows as a fixed-width text table."""
        raise NotImplementedError

    def markdown(self) -> str:
        """The rows as Markdown (default: the text table in a code block)."""
        return "```\n" + self.table() + "\n```"

    def __str__(self) -> str:
        """The text table (``print(result)``)."""
        return self.table()

    def figure(self):
        """A matplotlib Figure of the result (None when it has none)."""
        return None

    def to_frame(self):
        """The records as a pandas DataFrame (pandas is not a dependency: an ImportError says so)."""
        try:
            import pandas as pd
        except ImportError:
            raise ImportError("to_frame needs pandas: pip install pandas (records() gives the same rows)") from None
        return pd.DataFrame(self.records())

    def to_json(self) -> str:
        return json.dumps(json_ready({"name": self.name, "rows": self.records()}), indent=1)

    def write(self, out_dir, *, command: str | None = None) -> list:
        """Write ``<name>.md`` (the Markdown, headed by ``command`` when given: how to reproduce it),
        ``<name>.json``, ``<name>.csv`` and ``<name>.png`` (when there is a figure) into ``out_dir``,
        each atomically; returns the paths."""
        from ._files import atomic_write, csv_text

        head = f"Command: `{command}`\n\n" if command else ""
        files = {f"{self.name}.md": head + self.markdown() + "\n", f"{self.name}.json": self.to_json()}
        rows = self.records()
        if rows:
            files[f"{self.name}.csv"] = csv_text(
                [{k: v for k, v in r.items() if not isinstance(v, (list, dict))} for r in rows]
            )
        fig = self.figure()
        if fig is not None:
            files[f"{self.name}.png"] = figure_png(fig)
        os.makedirs(out_dir, exist_ok=True)
        return [atomic_write(os.path.join(out_dir, name), data) for name, data in files.items()]


class RowsResult(Result):
    """A result whose ``rows`` (dicts) are its records and whose table is Markdown already (``render``)."""

    def records(self) -> list:
        return [dict(r) for r in self.rows]

    def render(self) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    def table(self) -> str:
        return self.render()

    def markdown(self) -> str:
        return self.render()
