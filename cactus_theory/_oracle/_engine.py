"""What the oracle asks of an engine (``Engine``: its own rows and speculative samples), and a reported row read
as a law (``law_row``: probabilities in [0, 1] summing to 1 within ``MAX_MISSING``; ``on_support``: two rows on the
union of their tokens). The engines: ``_decoder_engine.DecoderEngine`` (this package's decoders),
``_llama_server.LlamaServerEngine`` (a running llama-server)."""

from __future__ import annotations

import abc
from typing import ClassVar

import numpy as np

__all__ = ["MAX_MISSING", "Engine", "law_row", "on_support"]

#: A reported row whose probabilities sum to less than 1 by more than this left mass out (top-N too small).
MAX_MISSING = 1e-3


class Engine(abc.ABC):
    """What the oracle asks of an engine: its rows (the processed law of the next token after a prefix, as the
    engine reports it), and speculative samples of a few tokens after a context, with the engine's drafted and
    accepted counts where it reports them.

    ``first_drafted``: the first generated position (0-based) a draft can decide; ``drafted``: that said in
    words, for the page; ``m``: drafts a step (None: the engine's own, unknown here)."""

    first_drafted: ClassVar[int] = 0
    drafted: ClassVar[str] = "every generated position, the first in the first block"
    m: int | None = None

    @abc.abstractmethod
    def setting(self) -> dict:
        """What decides the engine's law besides the context: its models, sampler, drafting (for the records)."""

    @abc.abstractmethod
    def rows(self, prefix) -> tuple:
        """({token: probability} of the verifier's processed law after ``prefix`` (token ids), {token: probability}
        of the drafter's or None): the engine's own report."""

    @abc.abstractmethod
    def sample(self, context, tokens, seed) -> tuple:
        """(the first ``tokens`` generated token ids after ``context``, by speculative decoding seeded by
        ``seed``; {"drafted": n, "accepted": n} of that request, or None where the engine reports none)."""

    def sample_many(self, context, tokens, seeds) -> list:
        """``sample`` for each seed of ``seeds`` (an engine that decodes several at once overrides it)."""
        return [self.sample(context, tokens, seed) for seed in seeds]

    def logits(self, prefix):
        """The raw logits after ``prefix`` as a ``RuleLogits`` over the same tokens as ``rows`` (sorted ids), for
        the rules that read them; None where the engine does not give them (an HTTP server's rows)."""
        return None

    def forget(self) -> None:
        """Drop the rows the engine keeps, so that the next ask goes to the engine again (the recheck)."""
        self.__dict__.pop("_rows", None)
        self.__dict__.pop("_cache", None)

    def close(self) -> None:
        return None


def law_row(row, where):
    """A reported row as (ids, probabilities), checked: probabilities in [0, 1] summing to 1 within
    ``MAX_MISSING``."""
    if not isinstance(row, dict) or not row:
        raise ValueError(f"{where}: the engine reported no probabilities (does it give n_probs / logprobs?)")
    ids = np.array(sorted(row), dtype=np.int64)
    probs = np.array([float(row[i]) for i in ids], dtype=np.float64)
    if not np.all(np.isfinite(probs)) or np.any(probs < 0) or np.any(probs > 1 + 1e-9):
        raise ValueError(f"{where}: the engine reported probabilities outside [0, 1] (or NaN)")
    total = float(probs.sum())
    if total < 1 - MAX_MISSING:
        raise ValueError(
            f"{where}: the reported probabilities sum to {total:.6f}: the top-N the engine returns leaves "
            f"{1 - total:.2g} of the law out (more than {MAX_MISSING:g}); ask for more (n_probs) or a smaller top-k"
        )
    if total > 1 + MAX_MISSING:
        raise ValueError(f"{where}: the reported probabilities sum to {total:.6f} > 1: not a law")
    return ids, probs / total


def on_support(ids_p, p, ids_q, q):
    """(support, p, q) of two reported rows on the union of their tokens."""
    support = np.union1d(ids_q, ids_p if ids_p is not None else ids_q)
    qq = np.zeros(support.size)
    qq[np.searchsorted(support, ids_q)] = q
    if ids_p is None:
        return support, None, qq
    pp = np.zeros(support.size)
    pp[np.searchsorted(support, ids_p)] = p
    return support, pp, qq
