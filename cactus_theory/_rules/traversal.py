"""Traversal Verification: a drafted tree judged from the leaves to the root, a whole path at a
time (Weng, Hu, Chen, Liu, Mei, Qiu, Tian and Shi, "Traversal Verification for Speculative Tree
Decoding", NeurIPS 2025, arXiv 2505.12398).

The tree's nodes carry an acceptance p_alpha: 1 at the root, min(p_alpha(parent) M_b(x) / M_s(x),
1) at a child x, with M_b the verifier's distribution after the parent and M_s the drafter's. The
first leaf in post-order is tested with its p_alpha: accepted, the path from the root to it is
emitted and then a token from M_b at it; rejected, it is deleted, and its parent's M_b becomes
norm((p_alpha M_b - M_s)+), its M_s loses the deleted token (renormalised: the law the next
sibling was drawn from, without replacement) and its p_alpha becomes S / (S + 1 - p_alpha),
S = sum_x (p_alpha M_b(x) - M_s(x))+; the descendants of its other children are recomputed. The
root, once a leaf, is accepted (p_alpha = 1). On a chain this is Sun et al.'s block
verification, run backwards.

``traverse`` computes the exact law of where the traversal stops and what it emits for given
drafted trees (batched), under the analysis's model: the rows at depth d are those of the
position d after the tree's root, whatever the path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .._math._validation import seeded_rng
from ._helpers import SpSOneDraft, block_inputs
from ._multidraft_protocol import MultiDraftLaw, MultiDraftRule
from ._protocol import BlockLaw, Rule
from .multidraft import RecursiveRejectionSampling

__all__ = ["TraversalTree", "TraversalVerification", "full_tree", "sample_tree", "token_level_tree", "traverse"]


def full_tree(k: int, m: int):
    """The full k-ary tree of depth m in post-order-friendly form: (parent (N,), depth (N,),
    children: list of child-index lists), node 0 the root, children in drawing order."""
    parent, depth, children = [-1], [0], [[]]

    def grow(node, d):
        for _ in range(k if d < m else 0):
            parent.append(node)
            depth.append(d + 1)
            children.append([])
            child = len(parent) - 1
            children[node].append(child)
            grow(child, d + 1)

    grow(0, 0)
    return np.array(parent), np.array(depth), children


def traverse(tree, tokens, draft_rows, target_rows, *, emitted=False):
    """The exact law of Traversal Verification on drafted trees, batched.

    Parameters
    ----------
    tree : (parent, depth, children)
        The shape (``full_tree`` or any tree in the same form; children in the order they were drawn).
    tokens : int array (B, N)
        The drafted token of each node (the root's entry is not read; -1: the node is absent, e.g.
        a parent whose drafter row has fewer tokens than the children asked).
    draft_rows : array (B, D, V)
        The drafter's distribution after a node of depth d (its children are drawn from it without
        replacement), d = 0..D-1, D >= the tree's depth.
    target_rows : array (B, D + 1, V)
        The verifier's distribution after a node of depth d, d = 0..D (after a leaf: the bonus row).

    Returns
    -------
    stop : array (B, N)
        P(the traversal accepts the path to node i), summing to 1 over the nodes.
    law : array (B, N, V), with ``emitted=True``
        The law of the token emitted after the path to node i, given it stops there (its M_b
        then: the verifier's row, or the residual its deleted children left).
    """
    parent, depth, children = tree
    batch, vocab = tokens.shape[0], target_rows.shape[-1]
    stop = np.zeros(tokens.shape)
    law = np.zeros((*tokens.shape, vocab)) if emitted else None
    rows = np.arange(batch)

    def visit(node, alpha, live):
        """Process the subtree at ``node`` entered with acceptance ``alpha`` (B,), ``live`` (B,) the
        chance of getting there; returns the chance of getting there and its whole subtree deleted."""
        d = depth[node]
        mb = target_rows[:, d, :].copy()  # M_b and M_s after this node
        ms = draft_rows[:, d, :].copy() if d < draft_rows.shape[1] else None
        reach = live.copy()
        for child in children[node]:
            x = tokens[:, child]
            here = x >= 0
            xs = np.where(here, x, 0)
            mbx, msx = mb[rows, xs], ms[rows, xs]
            with np.errstate(divide="ignore", invalid="ignore"):
                ratio = np.where(msx > 0, mbx / np.where(msx > 0, msx, 1.0), np.where(mbx > 0, 1.0, 0.0))
            child_alpha = np.where(here, np.minimum(alpha * ratio, 1.0), 0.0)
            deleted = visit(child, child_alpha, np.where(here, reach, 0.0))
            reach = np.where(here, deleted, reach)  # still in this subtree: the child's was deleted
            # the child is deleted: the parent's laws and acceptance move on (where it existed)
            excess = np.maximum(alpha[:, None] * mb - ms, 0.0)
            s = excess.sum(-1)
            with np.errstate(divide="ignore", invalid="ignore"):
                new_mb = np.where(s[:, None] > 0, excess / np.where(s > 0, s, 1.0)[:, None], mb)
                new_alpha = np.where(s + 1.0 - alpha > 0, s / np.where(s + 1.0 - alpha > 0, s + 1.0 - alpha, 1.0), 1.0)
            left = ms.copy()
            left[rows, xs] = 0.0
            z = left.sum(-1)
            with np.errstate(divide="ignore", invalid="ignore"):
                new_ms = np.where(z[:, None] > 0, left / np.where(z > 0, z, 1.0)[:, None], left)
            mb = np.where(here[:, None], new_mb, mb)
            ms = np.where(here[:, None], new_ms, ms)
            alpha = np.where(here, new_alpha, alpha)
        if parent[node] < 0:
            alpha = np.ones(batch)  # the root, a leaf at last, is accepted
        stop[:, node] = reach * alpha
        if emitted:
            law[:, node, :] = mb
        return reach * (1.0 - alpha)

    visit(0, np.ones(batch), np.ones(batch))
    return (stop, law) if emitted else stop


def token_level_tree(tree, tokens, draft_rows, target_rows):
    """P(token-level verification stops at node i), (B, N), on the same drafted trees as
    ``traverse``: recursive rejection sampling without replacement from the root down (a node's
    children tried in drawing order against the residual the earlier rejections left; the first
    accepted is descended into; if none is, the walk stops at the node). Its expected depth is
    what the prefix product of ``rrs(k, replacement=false)``'s per-position acceptance gives on
    average over the trees; per tree it pairs with ``traverse`` for a paired comparison."""
    _, depth, children = tree
    batch = tokens.shape[0]
    stop = np.zeros(tokens.shape)
    rows = np.arange(batch)

    def visit(node, live):
        d = depth[node]
        target = target_rows[:, d, :].copy()
        proposal = draft_rows[:, d, :].copy() if d < draft_rows.shape[1] else None
        reach = live.copy()
        for child in children[node]:
            x = tokens[:, child]
            here = x >= 0
            xs = np.where(here, x, 0)
            z = proposal.sum(-1)
            with np.errstate(divide="ignore", invalid="ignore"):
                prop = np.where(z[:, None] > 0, proposal / np.where(z > 0, z, 1.0)[:, None], proposal)
                px, qx = prop[rows, xs], target[rows, xs]
                accept = np.where(px > 0, np.minimum(qx / np.where(px > 0, px, 1.0), 1.0), (qx > 0) * 1.0)
            accept = np.where(here, accept, 0.0)
            visit(child, reach * accept)
            reach = reach * (1.0 - accept)
            rest = np.maximum(target - prop, 0.0)
            mass = rest.sum(-1)
            with np.errstate(divide="ignore", invalid="ignore"):
                target = np.where((here & (mass > 0))[:, None], rest / np.where(mass > 0, mass, 1.0)[:, None], target)
            proposal[rows, xs] = np.where(here, 0.0, proposal[rows, xs])
        stop[:, node] = reach

    visit(0, np.ones(batch))
    return stop


def sample_tree(rng, tree, draft_rows):
    """Tokens (B, N) of drafted trees: each node's children drawn from the drafter's row of its depth
    without replacement (the exponential race; -1 where the row has run out of tokens)."""
    parent, depth, children = tree
    batch = draft_rows.shape[0]
    tokens = np.full((batch, parent.size), -1, dtype=np.int64)
    for node in range(parent.size):
        kids = children[node]
        if not kids:
            continue
        row = draft_rows[:, depth[node], :]
        with np.errstate(divide="ignore"):
            keys = np.where(row > 0, rng.exponential(size=row.shape) / np.where(row > 0, row, 1.0), np.inf)
        order = np.argsort(keys, axis=-1)[:, : len(kids)]
        ok = np.take_along_axis(keys, order, -1) < np.inf
        # a row of fewer tokens than children drafts them all: the other children are absent (-1)
        tokens[:, kids[: order.shape[1]]] = np.where(ok, order, -1)
    return tokens


@dataclass(frozen=True)
class TraversalVerification(SpSOneDraft, Rule):
    """Traversal Verification of a drafted chain: test the whole block first (p_alpha = w_m), then
    step back one node at a time, the node at depth i passing with S_i / (S_i + 1 - w_i) once its
    child is deleted (S_i = sum_x (w_i q_{i+1}(x) - p_{i+1}(x))+), and emit the accepted path and a
    token from the residual there (the bonus token after m). **Lossless.** Its law on a chain is
    Sun et al.'s block verification (``block``; the paper's optimality on chains): ``block_law``
    runs the traversal itself (``traverse``), the tests check the two laws equal, and the accepted
    length on traces is block verification's (exact by enumeration, else Monte Carlo). For trees:
    ``traversal-tree``. Weng et al., NeurIPS 2025 (arXiv 2505.12398).
    """

    name: ClassVar[str] = "traversal"
    kind: ClassVar[str] = "block"
    reference: ClassVar[str] = (
        'Weng, Hu, Chen, Liu, Mei, Qiu, Tian & Shi, "Traversal Verification for Speculative Tree Decoding", NeurIPS '
        "2025 (arXiv 2505.12398), on a chain"
    )
    table: ClassVar[dict] = {
        "acceptance": "leaf to root: the whole block with w_m, then each node with S/(S + 1 − w)",
        "correction": "the residual norm((w q − p)+) where it stops",
        "emitted": "q (the sequence law)",
        "lossless": "yes",
    }
    #: its law is block verification's (the every-rule grid shows ``block``)
    comparison: ClassVar[tuple] = ()
    lossless: ClassVar[bool] = True
    same_law_as: ClassVar[tuple] = ("sps", "block", "hsd", "fly", "magic-mtp", "entropy-verify")

    def block_law(self, draft_probs, target_probs, drafted_tokens, *, logits=None) -> BlockLaw:
        """The exact law of tau and of the token emitted after it, by the traversal (float64)."""
        p, q, tokens, _ = block_inputs(self, draft_probs, target_probs, drafted_tokens, logits)
        lead, m, vocab = tokens.shape[:-1], tokens.shape[-1], q.shape[-1]
        flat = tokens.reshape(-1, m)
        nodes = np.concatenate([np.zeros((flat.shape[0], 1), dtype=np.int64), flat], axis=1)
        stop, law = traverse(full_tree(1, m), nodes, p.reshape(-1, m, vocab), q.reshape(-1, m + 1, vocab), emitted=True)
        # on a chain node i sits at depth i
        return BlockLaw(accepted=stop.reshape(*lead, m + 1), emitted=law.reshape(*lead, m + 1, vocab))

    def expected_block_lengths_for(self, p, q, ms, *, method="auto", n_paths=1024, seed=0, max_support=1_000_000):
        """Block verification's (the same law): ``BlockVerification.expected_block_lengths_for``."""
        from .block import BlockVerification

        return BlockVerification().expected_block_lengths_for(
            p, q, ms, method=method, n_paths=n_paths, seed=seed, max_support=max_support
        )

    def block_survival_for(self, p, q, ms, *, method="auto", n_paths=1024, seed=0, max_support=1_000_000):
        """Block verification's (the same law): ``BlockVerification.block_survival_for``."""
        from .block import BlockVerification

        return BlockVerification().block_survival_for(
            p, q, ms, method=method, n_paths=n_paths, seed=seed, max_support=max_support
        )


@dataclass(frozen=True)
class TraversalTree(MultiDraftRule):
    """Traversal Verification of a full tree of width k and depth m, each node's k children drawn
    from the drafter without replacement: the whole tree judged from the leaves up (``traverse``),
    so a rejected parent need not discard its children's paths. **Lossless** (checked by
    enumerating every tree and path on small vocabularies).

    Its tree accepted length on traces (``expected_tree_lengths_for``) is Monte Carlo over
    drafted trees, each with its exact law (standard errors given), for trees of at most
    ``MAX_NODES`` nodes (the traversal's state is per node); the token-level methods' tree AL
    (``rrs(replacement=false)`` on the same trees) is the prefix product of their per-position
    acceptance. At one position (a tree of depth 1) it is recursive rejection sampling without
    replacement, whose acceptance is the ``acceptance`` column (``multi_acceptance``), measured
    against the optimum of drafts without replacement. Weng et al., NeurIPS 2025 (arXiv
    2505.12398): +2.2% to +5.7% AL over token-level tree verification reported.
    """

    drafting: ClassVar[str] = "without-replacement"
    MAX_NODES: ClassVar[int] = 2048
    name: ClassVar[str] = "traversal-tree"
    judges: ClassVar[str] = "tree"  # the whole drafted tree at once
    reference: ClassVar[str] = (
        'Weng, Hu, Chen, Liu, Mei, Qiu, Tian & Shi, "Traversal Verification for Speculative Tree Decoding", NeurIPS '
        "2025 (arXiv 2505.12398)"
    )
    table: ClassVar[dict] = {
        "acceptance": "per position: rrs without replacement's; the tree: leaf-to-root paths",
        "correction": "the residual where it stops",
        "emitted": "q",
        "lossless": "yes",
    }
    #: its tree AL needs the whole tree (k^m nodes): ``experiments/sequence_rules.py`` compares it
    comparison: ClassVar[tuple] = ()
    tree_comparison: ClassVar[tuple] = ()
    examples: ClassVar[tuple] = ({"k": 3}, {"k": 1})
    label_fields: ClassVar[tuple] = ("k",)
    lossless: ClassVar[bool] = True
    same_law_as: ClassVar[tuple] = ("sps", "rrs", "spectr", "multi-draft-optimal", "eagle-tree", "sglang-tree", "block")

    def _one_level(self):
        return RecursiveRejectionSampling(k=self.k, replacement=False)

    def _verify(self, p, q, drafts) -> MultiDraftLaw:
        """A tree of depth 1 (the k drafts are the root's children), by the traversal."""
        drafts = np.asarray(drafts, dtype=np.int64)
        drafts = np.concatenate([drafts, np.full(self.k - drafts.size, -1, dtype=np.int64)])  # a short tuple: -1s
        nodes = np.concatenate([[0], drafts])[None, :]
        stop, law = traverse(full_tree(self.k, 1), nodes, p[None, None, :], np.stack([q, q])[None], emitted=True)
        accepted = np.append(stop[0, 1:], stop[0, 0])  # the root: no draft accepted
        emitted = stop[0, 0] * law[0, 0]
        for i, x in enumerate(drafts):
            if x >= 0:
                emitted[x] += stop[0, i + 1]
        return MultiDraftLaw(accepted, emitted)

    def multi_acceptance(self, draft_probs, target_probs):
        """P(some root child accepted) in a tree of depth 1: rrs without replacement's (exact)."""
        return self._one_level().multi_acceptance(draft_probs, target_probs)

    def emitted(self, draft_probs, target_probs, *, logits=None):
        """q: lossless (exact)."""
        _, q, _ = self._host(draft_probs, target_probs, logits)
        return np.array(q)

    def tree_size(self, m: int) -> int:
        """Nodes of the full tree of depth m, the root included: 1 + k + ... + k^m."""
        return sum(self.k**d for d in range(m + 1))

    def largest_depth(self) -> int:
        """The deepest full tree of at most ``MAX_NODES`` nodes at this k (0 when even depth 1 is bigger)."""
        depth = 0
        while self.tree_size(depth + 1) <= self.MAX_NODES:
            depth += 1
        return depth

    def check_depths(self, ms) -> None:
        """A ValueError, before any work, when a depth of ``ms`` makes a tree of more than ``MAX_NODES`` nodes."""
        over = [m for m in ms if self.tree_size(int(m)) > self.MAX_NODES]
        if over:
            m = min(over)
            raise ValueError(
                f"traversal-tree(k={self.k}) at m = {m} has {self.tree_size(m):,} nodes, more than the "
                f"{self.MAX_NODES} its exact traversal law is computed for: give m up to {self.largest_depth()} "
                f"(--m), or a smaller k"
            )

    def expected_tree_lengths_for(self, p, q, ms, *, n_paths=256, seed=0, acceptance=None):
        """{m: (method, E[tau] per tree root, standard errors)} on validated float64 rows
        (T, V), under independent positions (the rows at depth d are the root's position + d):
        ``n_paths`` seeded drafted trees per root, each with its exact E[tau | tree] (the
        traversal's law). A window longer than the rows is cut to them. A tree of depth 1 is exact
        (E[tau] = P(some child accepted), recursive rejection sampling without replacement's
        ``multi_acceptance``, or ``acceptance`` (T,) when the caller has it; method "exact"), deeper
        ones "monte-carlo". Trees of more than ``MAX_NODES`` nodes are refused (``check_depths``)."""
        found = self.tree_survival_for(p, q, ms, n_paths=n_paths, seed=seed, acceptance=acceptance)
        return {m: found[m][:3] for m in ms}

    def tree_survival_for(self, p, q, ms, *, n_paths=256, seed=0, acceptance=None):
        """{m: (method, E[tau], standard errors, P(tau >= j) per root (roots, depth))}: the accepted
        depth's law per tree root, from the same seeded trees as ``expected_tree_lengths_for``."""
        out = {}
        rng = seeded_rng(seed)
        positions = p.shape[0]
        self.check_depths([min(m, positions) for m in ms])
        for m in ms:
            depth_m = min(m, positions)
            if depth_m == 1:  # one level: the traversal is rrs without replacement, exactly
                found = self.multi_acceptance(p, q) if acceptance is None else acceptance
                values = np.array(found, dtype=np.float64).reshape(-1)[:positions]
                out[m] = ("exact", values, np.zeros(values.shape), values[:, None])
                continue
            tree = full_tree(self.k, depth_m)
            starts = positions - depth_m + 1
            index = np.minimum(np.arange(starts)[:, None] + np.arange(depth_m + 1)[None, :], positions - 1)
            values = np.empty((starts, n_paths))
            survival = np.empty((starts, depth_m))
            at_least = (tree[1][:, None] >= np.arange(1, depth_m + 1)[None, :]).astype(np.float64)  # (nodes, depth)
            chunk = max(1, 4096 // n_paths)
            for a in range(0, starts, chunk):
                sel = np.arange(a, min(a + chunk, starts))
                draft = np.repeat(p[index[sel, :depth_m]], n_paths, axis=0)
                target = np.repeat(q[index[sel]], n_paths, axis=0)
                tokens = sample_tree(rng, tree, draft)
                stop = traverse(tree, tokens, draft, target)
                values[sel] = (stop @ tree[1].astype(np.float64)).reshape(sel.size, n_paths)
                survival[sel] = (stop @ at_least).reshape(sel.size, n_paths, depth_m).mean(1)
            out[m] = ("monte-carlo", values.mean(-1), values.std(-1, ddof=1) / np.sqrt(n_paths), survival)
        return out
