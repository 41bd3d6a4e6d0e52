"""Does the rule timed first pay for the shapes it meets first? SpS's and Cactus's torch path
(``acceptance_and_correction``, validate=False) on rows of the vocabulary's size, timed in both orders
in fresh processes: each rule's first timed calls (after one untimed call) and its later ones, ms.

Usage:
    python experiments/rule_order_cost.py [--rows 2] [--vocab 151936] [--calls 20] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

ONE = """
import json, sys, time, torch
from cactus_theory import Cactus, SpS
rows, vocab, calls, device, order = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
gen = torch.Generator().manual_seed(0)
p = torch.softmax(torch.randn(rows, vocab, generator=gen) * 3, -1).to(device)
q = torch.softmax(torch.randn(rows, vocab, generator=gen) * 3, -1).to(device)
n = torch.randint(0, vocab, (rows,), generator=gen).to(device)
sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
rules = {"sps": SpS(), "cactus": Cactus(1.0)}
out = {}
for name in order.split(","):
    rule = rules[name]
    rule.acceptance_and_correction(p, q, n, validate=False)
    sync()
    times = []
    for _ in range(2 * calls):
        start = time.perf_counter()
        rule.acceptance_and_correction(p, q, n, validate=False)
        sync()
        times.append(time.perf_counter() - start)
    out[name] = {"first": sum(times[:calls]) / calls * 1e3, "later": sum(times[calls:]) / calls * 1e3}
print(json.dumps(out))
"""


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=151_936)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    for order in ("sps,cactus", "cactus,sps"):
        argv_one = [str(x) for x in (args.rows, args.vocab, args.calls, args.device, order)]
        start = time.perf_counter()
        found = json.loads(
            subprocess.run([sys.executable, "-c", ONE, *argv_one], check=True, capture_output=True, text=True).stdout
        )
        parts = [
            f"{name} first {v['first']:.2f} ms, later {v['later']:.2f} ms ({v['first'] / v['later']:.1f}x)"
            for name, v in found.items()
        ]
        print(f"order {order} ({time.perf_counter() - start:.0f} s): " + "; ".join(parts), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
