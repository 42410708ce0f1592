#!/usr/bin/env python3
"""HF tokenizers (Rust, through `from tokenizers import Tokenizer`) on the same corpus as
bench_tokenizer, single-threaded: tokenizer.json load time and encode / decode throughput.

    bench_tokenizer --write-corpus /tmp/corpus.txt          # also writes /tmp/corpus.txt.docs
    python3 bench/text/hf_tokenizers_bench.py --corpus /tmp/corpus.txt \
        [--tokenizer tests/data/tokenizer/qwen3/tokenizer.json] [--reps 3] \
        [--ids-out hf.ids] [--cases-out hf-random-cases.jsonl]

--ids-out writes the ids of the whole corpus as little-endian int32 (compare with
bench_tokenizer --write-ids). --cases-out writes random texts with HF's ids for the three
fixture tokenizers (tiny, qwen3, qwen3-vocab-q35-regex) for a differential test.
"""
import argparse
import array
import json
import os
import random
import sys
import time

# One thread: HF's Rust side parallelizes batches with rayon unless told not to.
os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["RAYON_RS_NUM_CPUS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

from tokenizers import Tokenizer  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "..", "tests", "data", "tokenizer")


def fnv1a(ids, h=0xCBF29CE484222325):
    for i in ids:
        v = i & 0xFFFFFFFF
        for b in range(4):
            h ^= (v >> (8 * b)) & 0xFF
            h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def bench(args):
    with open(args.corpus, "rb") as f:
        raw = f.read()
    corpus = raw.decode("utf-8")
    mb = len(raw) / 1e6
    docs = []
    docs_path = args.corpus + ".docs"
    if os.path.exists(docs_path):
        with open(docs_path) as f:
            for line in f:
                start, length = map(int, line.split())
                docs.append(raw[start:start + length].decode("utf-8"))
    print(f"corpus: {len(raw)} bytes ({mb:.2f} MB), {len(docs)} documents")

    t0 = time.perf_counter()
    tok = Tokenizer.from_file(args.tokenizer)
    first = (time.perf_counter() - t0) * 1e3
    best = first
    for _ in range(5):
        t0 = time.perf_counter()
        Tokenizer.from_file(args.tokenizer)
        best = min(best, (time.perf_counter() - t0) * 1e3)
    print(f"HF load {args.tokenizer}: first {first:.1f} ms, best of 5 {best:.1f} ms "
          f"(vocab {tok.get_vocab_size(with_added_tokens=True)})")

    ids = None
    for r in range(args.reps):
        t0 = time.perf_counter()
        ids = tok.encode(corpus, add_special_tokens=False).ids
        ms = (time.perf_counter() - t0) * 1e3
        note = " (cold cache)" if r == 0 else ""
        print(f"HF encode whole corpus, pass {r + 1}{note}: {ms:.1f} ms, {mb / (ms / 1e3):.2f} MB/s, "
              f"{len(ids)} tokens")
    if args.fnv:
        print(f"ids fnv1a: {fnv1a(ids):016x}")
    if args.ids_out:
        array.array("i", ids).tofile(open(args.ids_out, "wb"))
        print(f"wrote ids to {args.ids_out}")

    if docs:
        t0 = time.perf_counter()
        n = 0
        for d in docs:
            n += len(tok.encode(d, add_special_tokens=False).ids)
        ms = (time.perf_counter() - t0) * 1e3
        print(f"HF encode per document: {ms:.1f} ms, {mb / (ms / 1e3):.2f} MB/s, {n} tokens")

    t0 = time.perf_counter()
    text = tok.decode(ids, skip_special_tokens=False)
    ms = (time.perf_counter() - t0) * 1e3
    print(f"HF decode: {ms:.1f} ms, {mb / (ms / 1e3):.2f} MB/s of text, {len(text.encode())} bytes")


# ---- differential cases ------------------------------------------------------------------------

EDGE_CASES = [
    "\u180e!", "a\u180e b", "x\u180e\u180e y", "\u180e\n", " \u180e", "\u180e",
    "'S", "'\u017f", "I'M", "'Ll", "'VE", "it'\u017f", "\u212a'K", "'d'd'd",
    "\u0301abc", "q\u0301q", "q\u0301 q\u0301", "\u0928\u092e\u0938\u094d\u0924\u0947",
    "\u1112\u1161\u11ab\u1100\u1173\u11af", "\uac00\u11a8", "e\u0301\u0327", "\u212b\u2126\uf900",
    "<|im_start|><|im_end|>", "a<|endoftext|>b", "<|im_start", "<think>\nx\n</think>\n\n", "</think>",
    "<|im_end|>\u0301", "  <|im_end|>  ", "\u2028\u2029", "\u3000\u3000x", "\r\n\r\n", " \t \n", "\n \n",
    "1234567890" * 3, "\U0001f468\u200d\U0001f4bb\U0001f3fd", "\U0001f1eb\U0001f1f7\U0001f1ef", "\ufeffbom",
    "a\u00adb", "\u0085x", "x\u000by\u000cz", "\x00\x01\x7f", "\U0010ffff\U000e0001", "\ud7a3\ud7a4",
]

RANGES = [(0x20, 0x7E), (0x09, 0x0D), (0xA0, 0xFF), (0x100, 0x24F), (0x300, 0x36F), (0x370, 0x3FF),
          (0x400, 0x4FF), (0x590, 0x5FF), (0x600, 0x6FF), (0x900, 0x97F), (0x980, 0x9FF), (0xB00, 0xBFF),
          (0xD00, 0xD7F), (0xE00, 0xE7F), (0x1100, 0x11FF), (0x1800, 0x18AF), (0x1E00, 0x1EFF),
          (0x2000, 0x206F), (0x2100, 0x214F), (0x3000, 0x30FF), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3),
          (0xF900, 0xFAFF), (0xFE00, 0xFE0F), (0xFF00, 0xFFEF), (0x1F300, 0x1FAFF), (0x1D100, 0x1D1FF),
          (0x10000, 0x10FFFF)]
PIECES = [" ", "  ", "'s", "'T", "\n", "\r\n", "\t", "<|im_end|>", "<think>", "123", "...", "!!", "e\u0301"]


def random_text(rng, n):
    out = []
    for _ in range(n):
        k = rng.randrange(10)
        if k < 2:
            out.append(rng.choice(PIECES))
        elif k == 2:
            out.append(chr(0x300 + rng.randrange(0x70)))
        else:
            lo, hi = rng.choice(RANGES)
            cp = rng.randint(lo, hi)
            out.append("x" if 0xD800 <= cp <= 0xDFFF else chr(cp))
    return "".join(out)


def fixture_tokenizers():
    tiny_path = os.path.join(DATA, "tiny", "tokenizer.json")
    qwen3_path = os.path.join(DATA, "qwen3", "tokenizer.json")
    tiny = json.load(open(tiny_path, encoding="utf-8"))
    q35 = json.load(open(qwen3_path, encoding="utf-8"))
    q35["pre_tokenizer"]["pretokenizers"][0]["pattern"] = tiny["pre_tokenizer"]["pretokenizers"][0]["pattern"]
    return {
        "tiny": Tokenizer.from_file(tiny_path),
        "qwen3": Tokenizer.from_file(qwen3_path),
        "qwen3-vocab-q35-regex": Tokenizer.from_str(json.dumps(q35)),
    }


def cases(args):
    rng = random.Random(args.seed)
    texts = list(EDGE_CASES)
    for _ in range(args.n_cases):
        texts.append(random_text(rng, rng.randint(1, 40)))
    toks = fixture_tokenizers()
    n = 0
    with open(args.cases_out, "w", encoding="utf-8") as f:
        for name, tok in toks.items():
            for t in texts:
                ids = tok.encode(t, add_special_tokens=False).ids
                f.write(json.dumps({"tokenizer": name, "text": t, "ids": ids,
                                    "decoded": tok.decode(ids, skip_special_tokens=False)},
                                   ensure_ascii=True) + "\n")
                n += 1
    print(f"wrote {n} cases to {args.cases_out}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus")
    p.add_argument("--tokenizer", default=os.path.join(DATA, "qwen3", "tokenizer.json"))
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--ids-out")
    p.add_argument("--fnv", action="store_true", help="print the FNV-1a of the ids (slow in Python)")
    p.add_argument("--cases-out")
    p.add_argument("--n-cases", type=int, default=400)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    import tokenizers
    print(f"tokenizers {tokenizers.__version__}, python {sys.version.split()[0]}")
    if args.corpus:
        bench(args)
    if args.cases_out:
        cases(args)


if __name__ == "__main__":
    main()
