"""Writes llm.c-format token shards of seeded random GPT-2 token ids, so that `tilegrad train`'s
loop can be timed on real shard files on a machine without a dataset.

    python3 bench/make_shards.py OUT_DIR [--tokens N] [--vocab V] [--seed S]

Writes OUT_DIR/train_000000.bin (N tokens) and OUT_DIR/val_000000.bin (N/100 tokens): a header of
256 int32 (magic 20240520, version 1, token count) and the tokens as uint16, as llm.c writes them.
"""
import argparse
import array
import os
import random


def write(path, count, vocab, rng):
    header = array.array("i", [0] * 256)
    header[0], header[1], header[2] = 20240520, 1, count
    tokens = array.array("H", rng.randbytes(2 * count))
    tokens = array.array("H", (t % vocab for t in tokens))
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.tobytes())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--tokens", type=int, default=20_000_000)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    rng = random.Random(a.seed)
    write(os.path.join(a.out, "train_000000.bin"), a.tokens, a.vocab, rng)
    write(os.path.join(a.out, "val_000000.bin"), max(a.tokens // 100, 65536), a.vocab, rng)
    print(f"wrote {a.tokens} train tokens to {a.out}")


if __name__ == "__main__":
    main()
