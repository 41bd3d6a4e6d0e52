"""How fast llama.cpp reads a prompt here: the Qwen2.5-Coder pair's prompt processing in tokens a second
(one forward of --tokens tokens into an emptied cache, the median of --repeats after one untimed), with
the CPU features the installed llama.cpp was built with. What decides the exact quality referee's
minutes: a problem is one such forward per model.

Usage:
    python experiments/llamacpp_prompt_speed.py [--models DIR] [--tokens 100] [--context 512]
    LLAMA_CPP_LIB_PATH=DIR python experiments/llamacpp_prompt_speed.py   # another build of llama.cpp's libraries
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
from common import CACHE, DRAFT, VERIFIER

from cactus_theory import load_model

PAIR = (VERIFIER, DRAFT)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=os.path.join(CACHE, "models"))
    parser.add_argument("--tokens", type=int, default=100)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    for name in PAIR:
        model = load_model(os.path.join(args.models, name), engine="llama.cpp", sequences=1, context=args.context)[0]
        high = min(20_000, model.vocab_size)  # ordinary tokens of the vocabulary, the same for both models
        ids = [int(t) for t in np.random.default_rng(0).integers(high // 20, high, size=args.tokens)]
        seq = model.sequence()
        times = []
        for _ in range(args.repeats + 1):
            seq.crop(0)
            start = time.perf_counter()
            seq.feed(ids, want="last")
            times.append(time.perf_counter() - start)
        seq.close()
        median = float(np.median(times[1:]))
        print(
            f"{name}: {args.tokens} prompt tokens in {median:.3f} s: {args.tokens / median:.0f} tokens/s "
            f"({model.threads} threads; llama.cpp built with {model.kernels})",
            flush=True,
        )
        model.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
