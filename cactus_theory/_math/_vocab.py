"""Token-level intersection of two vocabularies: what a drafter with another tokenizer can propose
to a verifier (Timor, Mamou, Korat, Berchansky, Pereg, Jain, Schwartz, Wasserblat and Harel,
"Accelerating LLM Inference with Lossless Speculative Decoding Algorithms for Heterogeneous
Vocabularies", ICML 2025, arXiv 2502.05202: TLI; vLLM ``use_heterogeneous_vocab``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._validation import host_probabilities, is_integer

__all__ = ["VocabularyMap"]

#: The largest vocabulary a map takes (ids 0 to this - 1): today's largest tokenizers hold ~10^6 tokens.
MAX_VOCABULARY = 1 << 24
_SPACE_MARKERS = ("\u0120", "\u2581")  # byte-level BPE's 'Ġ' and SentencePiece's '▁' for a leading space


def _spaces(token: str) -> str:
    for marker in _SPACE_MARKERS:
        token = token.replace(marker, " ")
    return token


@dataclass(frozen=True, eq=False)
class VocabularyMap:
    """Which drafter tokens the verifier has, and under which id: ``draft_to_target[i]`` is the
    verifier's id of the drafter's token i, or -1 where the verifier has no token with its string.

    TLI drafts from the drafter's distribution restricted to the shared tokens and renormalised,
    maps the draft to the verifier's id and verifies by standard speculative sampling (``sps``;
    ``tli`` names it), so the emitted law is the verifier's exactly and the acceptance is
    sum_x min(p'(x), q(x)) with p' = ``project(p)``, exact. Tokens the drafter lacks are never
    proposed; the drafter's mass on tokens the verifier lacks is redistributed over the rest.

    Examples
    --------
    >>> import numpy as np
    >>> vmap = VocabularyMap.from_vocabularies(["a", "b", "zz"], ["b", "a", "c"])
    >>> vmap.draft_to_target.tolist()
    [1, 0, -1]
    >>> vmap.project(np.array([0.5, 0.3, 0.2])).round(4).tolist()   # on the verifier's ids
    [0.375, 0.625, 0.0]
    """

    draft_to_target: np.ndarray
    target_size: int

    def __post_init__(self):
        ids = np.asarray(self.draft_to_target)
        if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(f"draft_to_target must be a 1-d integer array of verifier ids (-1: none); got {ids!r}")
        if not is_integer(self.target_size) or self.target_size < 1:
            raise ValueError(
                f"target_size (the verifier's vocabulary size) must be an integer >= 1; got {self.target_size!r}"
            )
        if ((ids < -1) | (ids >= self.target_size)).any():
            raise ValueError(f"draft_to_target ids must lie in [-1, {self.target_size}) (-1: not shared)")
        shared = ids[ids >= 0]
        if np.unique(shared).size != shared.size:
            raise ValueError(
                "draft_to_target maps two drafter tokens to one verifier id: a token map must be one to one"
            )
        object.__setattr__(self, "draft_to_target", ids.astype(np.int64))

    @classmethod
    def from_vocabularies(cls, draft_vocab, target_vocab, *, normalize="spaces"):
        """The map between two vocabularies given as token strings in id order (a sequence) or as
        {token string: id} (a tokenizer's ``get_vocab()``). ``normalize``: "spaces" (a leading
        'Ġ' or '▁' read as a space, so byte-level and SentencePiece vocabularies meet), None (the
        strings as they are) or a function of a string."""
        if callable(normalize):
            norm = normalize
        elif normalize is None:
            norm = str
        elif isinstance(normalize, str) and normalize == "spaces":
            norm = _spaces
        else:
            raise ValueError(f"normalize must be 'spaces', None or a function of a token string; got {normalize!r}")

        def as_ids(vocab, name):
            if isinstance(vocab, dict):
                pairs = list(vocab.items())
            else:
                try:
                    pairs = [(tok, i) for i, tok in enumerate(vocab)]
                except TypeError:
                    raise ValueError(f"{name} must be a sequence of token strings or a dict token -> id") from None
            if not pairs or not all(isinstance(t, str) and is_integer(i) for t, i in pairs):
                raise ValueError(f"{name} must map token strings to integer ids (non-empty)")
            bad = [(t, int(i)) for t, i in pairs if not 0 <= i < MAX_VOCABULARY]
            if bad:
                raise ValueError(
                    f"{name}: token {bad[0][0]!r} has id {bad[0][1]}; ids are 0 to {MAX_VOCABULARY - 1:,} "
                    "(a tokenizer's ids count from 0)"
                )
            seen: dict = {}
            for tok, i in pairs:
                if int(i) in seen:
                    raise ValueError(
                        f"{name}: tokens {seen[int(i)]!r} and {tok!r} share id {int(i)}; a vocabulary has "
                        "one token per id"
                    )
                seen[int(i)] = tok
            return pairs

        draft, target = as_ids(draft_vocab, "draft_vocab"), as_ids(target_vocab, "target_vocab")
        size_d = max(i for _, i in draft) + 1
        size_t = max(i for _, i in target) + 1
        by_string: dict = {}
        for tok, i in target:
            by_string.setdefault(norm(tok), int(i))  # two verifier tokens with one string: the lower id listed first
        ids = np.full(size_d, -1, dtype=np.int64)
        taken = set()
        for tok, i in sorted(draft, key=lambda pair: pair[1]):
            j = by_string.get(norm(tok), -1)
            if j >= 0 and j not in taken:
                ids[int(i)] = j
                taken.add(j)
        return cls(ids, int(size_t))

    @property
    def shared(self) -> np.ndarray:
        """Boolean mask over the verifier's ids: the tokens the drafter can propose."""
        out = np.zeros(self.target_size, dtype=bool)
        out[self.draft_to_target[self.draft_to_target >= 0]] = True
        return out

    def shared_mass(self, draft_probs) -> np.ndarray:
        """The drafter's probability of the shared tokens, per row (...): what TLI keeps before
        renormalising."""
        p = self._rows(draft_probs)
        return p[..., self.draft_to_target >= 0].sum(-1)

    def project(self, draft_probs) -> np.ndarray:
        """TLI's drafting law on the verifier's ids, per row: the drafter's distribution (...,
        V_draft) restricted to the shared tokens, renormalised, at their verifier ids (..., V_target);
        float64, exact. A row with no mass on a shared token is refused (TLI cannot draft there)."""
        p = self._rows(draft_probs)
        keep = self.draft_to_target >= 0
        mass = p[..., keep].sum(-1)
        if (mass <= 0).any():
            bad = np.argwhere(mass <= 0)[0]
            raise ValueError(
                f"draft_probs row {tuple(int(i) for i in bad)} puts no mass on a token the verifier shares: TLI cannot "
                "draft there"
            )
        out = np.zeros((*p.shape[:-1], self.target_size))
        out[..., self.draft_to_target[keep]] = p[..., keep] / mass[..., None]
        return out

    def _rows(self, draft_probs):
        p = host_probabilities(draft_probs, "draft_probs")
        if p.shape[-1] != self.draft_to_target.size:
            raise ValueError(
                f"draft_probs rows have {p.shape[-1]} entries; the map's drafter vocabulary has "
                f"{self.draft_to_target.size}"
            )
        return p
