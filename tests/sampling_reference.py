"""The sampling processing written out row by row from its definition (temperature, then top-k with
the ties of the k-th kept, then top-p over the stable descending order): the reference of
``processed_probs`` and of the device path (``_models._device_rows.process_rows``). Written without
the package."""

import math

import numpy as np


def reference_probs(logits, temperature, top_k, top_p):
    """Processed probabilities by plain loops (the definition, row by row)."""
    out = np.zeros_like(logits, dtype=np.float64)
    for i, row in enumerate(np.asarray(logits, dtype=np.float64)):
        if temperature == 0:
            out[i, int(np.argmax(row))] = 1.0
            continue
        z = row / temperature
        order = sorted(range(len(z)), key=lambda j: (-z[j], j))
        if top_k and top_k < len(z):  # every logit tied with the k-th stays
            kth = z[order[top_k - 1]]
            order = [j for j in order if z[j] >= kth]
        order = [j for j in order if z[j] > -np.inf] or order[:1]
        w = np.exp(z[order] - z[order[0]])
        w /= w.sum()
        kept, mass = [], 0.0
        for j, pj in zip(order, w, strict=True):
            if mass < top_p:
                kept.append(j)
            mass += pj
        ww = np.exp(z[kept] - z[order[0]])
        out[i, kept] = ww / ww.sum()
    return out


def reference_chain_probs(logits, temperature, top_k, top_p, min_p, steps):
    """The same for any sampler chain, by plain loops over one row at a time: ``steps`` in order, each on the
    tokens the steps before it kept ("temperature" divides the logits; "top_k" keeps the tokens at or above
    the k-th largest kept logit; "top_k_exact" the k first in (logit descending, id ascending) order; "top_p"
    the first tokens of that order whose mass before them, under the softmax of the current logits over
    the kept tokens, is below top_p; "min_p" those whose probability there is at least min_p times the
    largest), then the softmax of the logits over T over what is kept."""
    out = np.zeros_like(logits, dtype=np.float64)
    for i, row in enumerate(np.asarray(logits, dtype=np.float64)):
        if temperature == 0:
            out[i, int(np.argmax(row))] = 1.0
            continue
        kept = sorted((j for j in range(len(row)) if row[j] > -np.inf), key=lambda j: (-row[j], j))
        scale = 1.0
        for step in steps:
            if step == "temperature":
                scale = temperature
            elif step == "top_k" and 0 < top_k < len(row) and len(kept) > top_k:
                kth = row[kept[top_k - 1]]
                kept = [j for j in kept if row[j] >= kth]
            elif step == "top_k_exact" and 0 < top_k < len(row):
                kept = kept[:top_k]
            elif step == "top_p" and top_p < 1:
                w = [math.exp((row[j] - row[kept[0]]) / scale) for j in kept]
                total, mass, keep = sum(w), 0.0, []
                for j, wj in zip(kept, w, strict=True):
                    if mass < top_p:
                        keep.append(j)
                    mass += wj / total
                kept = keep
            elif step == "min_p" and min_p > 0:
                kept = [j for j in kept if math.exp((row[j] - row[kept[0]]) / scale) >= min_p]
        w = np.array([math.exp((row[j] - row[kept[0]]) / temperature) for j in kept])
        out[i, kept] = w / w.sum()
    return out
