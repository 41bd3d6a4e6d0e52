"""The sampling processing written out row by row from its definition (temperature, then top-k with
the ties of the k-th kept, then top-p over the stable descending order): the reference of
``processed_probs`` and of the device path (``_models._device.process_rows``). Written without
the package."""

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
