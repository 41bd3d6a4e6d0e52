"""Synthetic worlds of answers whose exact accuracy under any rule is enumerable (``AnswerWorld``): where an
estimator of long-answer accuracy (``pooled_accuracy``) is checked against the truth.

A world holds problems; each problem has its own drafter and verifier, first-order Markov over a small vocabulary
(the row at position t depends on the token before it), and its own grader of whole answers (an answer of
``length`` tokens is correct when its tokens sum to the problem's key modulo the vocabulary). Every answer of
every problem is enumerated (vocab ** length of them), so each method's law of answers, and its exact expected
accuracy, come from ``answer_log_prob`` on the answers' own rows: exact up to float64 rounding."""

from __future__ import annotations

import itertools

import numpy as np

from .._math._validation import check_int
from ._answer_law import answer_log_prob

__all__ = ["AnswerWorld"]


class AnswerWorld:
    """``problems`` Markov problems over ``vocab`` tokens with answers of ``length`` tokens, drawn from ``seed``.

    ``closeness`` in [0, 1]: how near the drafter's rows are to the verifier's (1: the same rows).
    Methods are ``None`` (the verifier alone) or a token rule (spec or object) with a draft length ``m``."""

    def __init__(self, problems=100, *, vocab=3, length=4, closeness=0.6, concentration=0.6, seed=0):
        self.problems = check_int(problems, "problems", 1)
        self.vocab = check_int(vocab, "vocab", 2, high=8)
        self.length = check_int(length, "length", 1, high=8)
        if not 0 <= closeness <= 1:
            raise ValueError(f"closeness must lie in [0, 1] (1: the drafter's rows are the target's); got {closeness}")
        rng = np.random.default_rng(seed)
        shape = (self.problems, self.length, self.vocab + 1)  # the token before: vocab + 1 for the start
        self.target = rng.dirichlet(np.full(self.vocab, concentration), shape)
        noise = rng.dirichlet(np.full(self.vocab, concentration), shape)
        self.draft = closeness * self.target + (1 - closeness) * noise
        self.answers = np.array(list(itertools.product(range(self.vocab), repeat=self.length)), dtype=np.int64)
        self.key = rng.integers(0, self.vocab, self.problems)
        self.correct = (self.answers.sum(-1)[None, :] % self.vocab) == self.key[:, None]  # (problems, answers)
        before = np.concatenate([np.full((len(self.answers), 1), self.vocab), self.answers[:, :-1]], axis=1)
        t = np.arange(self.length)
        # rows (problems, answers, length, vocab): each answer's rows at its own prefixes
        self._p = self.draft[:, t[None, :], before]
        self._q = self.target[:, t[None, :], before]
        self._laws = {}

    def log_probs(self, method, m=1, answers=None):
        """log P(answer) under ``method`` at draft length ``m``: (problems, all answers), or (k,) for
        ``answers`` given as (problem index, answer index) arrays."""
        key = (None if method is None else str(method), m)
        if key not in self._laws:
            tokens = np.broadcast_to(self.answers, (self.problems, *self.answers.shape))
            self._laws[key] = answer_log_prob(method, self._p, self._q, tokens, m)
        law = self._laws[key]
        if answers is None:
            return law
        return law[answers[0], answers[1]]

    def accuracy(self, method, m=1):
        """Each problem's exact expected accuracy under ``method`` (problems,)."""
        return (np.exp(self.log_probs(method, m)) * self.correct).sum(-1)

    def sample(self, method, m, problems, rng):
        """One answer index per entry of ``problems`` (problem indices), drawn from ``method``'s exact law."""
        law = np.exp(self.log_probs(method, m))[problems]
        cumulative = np.cumsum(law, axis=-1)
        u = rng.random(len(problems)) * cumulative[:, -1]
        return (cumulative < u[:, None]).sum(-1)

    def pool(self, problems, decoded, asked, m, rng):
        """One answer a method of ``decoded`` to each of ``problems`` (problem indices; each entry a problem of the
        pool, labelled by its place), drawn from the method's exact law, with every method's (``decoded`` and
        ``asked``: {label: None or a rule}) exact log-probability of each answer: (problem labels, decoded-by
        labels, grades, {label: log-probabilities}), ``pooled_accuracy``'s inputs."""
        problems = np.asarray(problems)
        labels, by, grade, where = [], [], [], []
        for label, method in decoded.items():
            answer = self.sample(method, m, problems, rng)
            labels += list(range(len(problems)))
            by += [label] * len(problems)
            grade += self.correct[problems, answer].astype(float).tolist()
            where += list(zip(problems.tolist(), answer.tolist(), strict=True))
        where = np.array(where).T
        log_probs = {label: self.log_probs(method, m, where) for label, method in {**decoded, **asked}.items()}
        return labels, by, grade, log_probs
