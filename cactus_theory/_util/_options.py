"""A call that takes its settings as one record or as keywords: how the two meet (``merged_options``).
The record: ``_analysis._options.AnalysisOptions`` (decoding's, ``_models._decode_spec.DecodeSpec``, is given
whole or built from the keywords by ``decode_prompts`` itself)."""

from __future__ import annotations

__all__ = ["merged_options"]


def merged_options(record_type, options, given: dict) -> dict:
    """The settings of a call that takes a record ``options`` (of ``record_type``) or its fields as
    keywords (``given``: every keyword as the call received it): the record's fields when it is given,
    else the keywords; both at once (a keyword away from its default beside a record) is a ValueError."""
    defaults = record_type()
    if options is None:
        return given
    if not isinstance(options, record_type):
        raise ValueError(f"options must be an {record_type.__name__}; got {type(options).__name__}")
    clash = sorted(k for k, v in given.items() if not _same(v, getattr(defaults, k)))
    if clash:
        raise ValueError(f"give options= or the keywords {', '.join(clash)}, not both")
    return options.keywords()


def _same(a, b) -> bool:
    try:
        return bool(a == b) if a is not b else True
    except (TypeError, ValueError):  # arrays and objects without a plain equality
        return False
