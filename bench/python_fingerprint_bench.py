"""Cost of PackedBatchSampler's corpus fingerprint (wlb.torch.sampler.corpus_fingerprint: SHA-256
over the int64 lengths in 64 MiB chunks on a thread pool) beside the count-and-sum it replaced,
for in-memory and memory-mapped lengths arrays, in one run.

    build/pyenv/bin/python bench/python_fingerprint_bench.py --documents 10000000 100000000

Prints one JSON line per (documents, storage): seconds (the best of --repeat), GB/s and the
count-and-sum seconds of the same array; then, for the first size, single-thread hashlib GB/s of
SHA-256 and BLAKE2b over the same bytes (why the fingerprint uses SHA-256).
"""

import argparse
import hashlib
import json
import os
import tempfile
import time

import numpy as np

from wlb.torch.sampler import corpus_fingerprint


def best(fn, repeat):
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--documents", type=int, nargs="+", default=[10_000_000])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    for n in args.documents:
        lengths = np.random.default_rng(n).integers(1, 1 << 17, n, dtype=np.int64)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "lengths.npy")
            np.save(path, lengths)
            mapped = np.load(path, mmap_mode="r")
            for storage, array in (("memory", lengths), ("mmap", mapped)):
                seconds = best(lambda: corpus_fingerprint(array), args.repeat)
                count_sum = best(lambda: (len(array), int(array.sum())), args.repeat)
                print(json.dumps({"documents": n, "storage": storage, "bytes": array.nbytes,
                                  "fingerprint_s": round(seconds, 4),
                                  "gb_per_s": round(array.nbytes / seconds / 1e9, 3),
                                  "count_and_sum_s": round(count_sum, 4),
                                  "threads": os.cpu_count()}), flush=True)
            del mapped
        if n == args.documents[0]:
            view = memoryview(lengths).cast("B")
            for name in ("sha256", "blake2b"):
                seconds = best(lambda: hashlib.new(name, view).digest(), args.repeat)
                print(json.dumps({"documents": n, "hashlib_single_thread": name,
                                  "gb_per_s": round(lengths.nbytes / seconds / 1e9, 3)}),
                      flush=True)


if __name__ == "__main__":
    main()
