#!/usr/bin/env python3
"""Document-length streams of shapes none of the registered distributions has, for the CP balance
table's held-out check (docs/results/cp/memory_cap/README.md): each a JSON array of lengths that
`sharding_table --balance --docs FILE` packs at S = 128K like any stream.

    python3 bench/stress_lengths.py OUT_DIR            # every shape, OUT_DIR/<shape>.json
    python3 bench/stress_lengths.py OUT_DIR longtail   # one

Each shape draws from its own seeded generator (Python's Mersenne Twister, integer seed), so a
shape's file is the same on every machine, until the stream holds at least --tokens tokens.
"""
import argparse
import json
import os
import random

CONTEXT = 131072

# name -> (seed, one length from the generator, what the shape is)
SHAPES = {
    "uniform": (1, lambda r: r.randint(1, CONTEXT), "uniform in [1, 128K]"),
    "full": (2, lambda r: CONTEXT, "every document 128K: one per micro-batch"),
    "half": (3, lambda r: CONTEXT // 2, "every document 64K"),
    "third": (4, lambda r: 43690, "every document 43690 tokens (three per 128K)"),
    "tiny": (5, lambda r: r.randint(16, 256), "uniform in [16, 256]"),
    "medium": (6, lambda r: r.randint(8192, 32768), "uniform in [8K, 32K]"),
    "twomode": (7, lambda r: 100 if r.random() < 0.6 else 60000,
                "60% of 100 tokens, 40% of 60000"),
    "pareto": (8, lambda r: round(64 * r.paretovariate(1.1)), "64 x Pareto(1.1)"),
    "lognormal": (9, lambda r: round(r.lognormvariate(8, 2)), "lognormal(8, 2)"),
    "prime": (10, lambda r: r.choice([1021, 4099, 16381, 65521]),
              "primes next to tile multiples: 1021, 4099, 16381, 65521"),
    "longtail": (11, lambda r: CONTEXT if r.random() < 0.05 else r.randint(32, 2048),
                 "5% of 128K, the rest uniform in [32, 2048]"),
}


def lengths(shape, tokens):
    seed, draw, _ = SHAPES[shape]
    rng = random.Random(seed)
    out, total = [], 0
    while total < tokens:
        x = min(CONTEXT, max(1, int(draw(rng))))
        out.append(x)
        total += x
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("shapes", nargs="*", help=f"default: all of {', '.join(SHAPES)}")
    # sharding_table --balance reads (steps + 2) x micro_batches x 128K = 52 x 4 x 128K tokens.
    parser.add_argument("--tokens", type=int, default=52 * 4 * CONTEXT)
    args = parser.parse_args()
    for shape in args.shapes or SHAPES:
        if shape not in SHAPES:
            parser.error(f"unknown shape {shape!r}; expected one of {', '.join(SHAPES)}")
    os.makedirs(args.out_dir, exist_ok=True)
    for shape in args.shapes or SHAPES:
        with open(os.path.join(args.out_dir, f"{shape}.json"), "w") as f:
            json.dump(lengths(shape, args.tokens), f)


if __name__ == "__main__":
    main()
