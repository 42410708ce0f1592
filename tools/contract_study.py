"""How much accuracy a cheaper 4-bit unit would cost: the float64 forward of a 4-bit Qwen3.5
checkpoint (tools/reference/spec_forward.py, written from docs/qwen35.md) with x rounded the way
a candidate numerics contract rounds it before every weight product, against the same forward with x exact and against the fixture's HF
float64 reference. Evidence for issue #4's contract question (docs/numerics.md "The 4-bit unit
dot"): how few bits a unit's integers may keep.

usage: /usr/bin/python3 tools/contract_study.py FIXTURE_DIR [SCHEME ...]
SCHEME: none | BLOCK:P  -- x in blocks of BLOCK inputs sharing one power-of-two scale, integers
        xi = rint(x * 2^(P-1-E)) with E the exponent of the block's largest |x| (|xi| <= 2^P).
        The contract today is 8:22 (docs/numerics.md). Default: none 8:22 8:16 8:15 8:14 8:12 64:22 64:15.
Needs python3-numpy (Debian). Prints, per scheme, the worst and median relative L2 error of a
row of logits against the exact-x forward and against HF's reference, and the greedy tokens that
differ from HF's.
"""
import json, os, sys
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference"))
from spec_forward import build  # noqa: E402  (the project's float64 forward of docs/qwen35.md)


def rounder(scheme):
    """x -> x as the scheme's integers represent it (exactly: xi * 2^(E-P+1))."""
    if scheme == 'none':
        return lambda x: x
    try:
        block, p = (int(t) for t in scheme.split(':'))
        assert block > 0 and 2 <= p <= 30
    except (ValueError, AssertionError):
        raise SystemExit(f'scheme {scheme!r}: expected none or BLOCK:P (e.g. 8:22, BLOCK > 0, 2 <= P <= 30)')

    def r(x):
        n = x.size
        assert n % block == 0, f'{n} inputs in blocks of {block}'
        xb = x.reshape(-1, block)
        m = np.max(np.abs(xb), axis=1, keepdims=True)
        _, e = np.frexp(m)  # m = f * 2^e, f in [0.5, 1): E = e - 1
        up = np.ldexp(1.0, (p - e).astype(np.int64))  # 2^(P-1-E)
        xi = np.rint(xb * up)
        out = np.where(m > 0, xi / up, 0.0)
        return out.reshape(x.shape)
    return r


def main():
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    d = sys.argv[1]
    schemes = sys.argv[2:] or ['none', '8:22', '8:16', '8:15', '8:14', '8:12', '64:22', '64:15']
    rounders = {s: rounder(s) for s in schemes}  # (a bad scheme stops here, before any forward)
    if 'quantization' not in json.load(open(d + '/config.json')):
        raise SystemExit(f'{d}: not an MLX 4-bit checkpoint (no "quantization" in config.json)')

    ref = build(d)[1]
    prompt, gen = list(ref['prompt_ids']), list(ref['generated_ids'])
    hf = np.vstack([ref['prefill_logits'], ref['decode_logits'][:-1]]).astype(np.float64)
    tokens = prompt + gen[:-1]

    def run(rx):  # logits at every position, teacher-forced, from a fresh state
        step = build(d, rx)[0]
        return np.stack([step(t, pos) for pos, t in enumerate(tokens)])

    exact = run(None)
    rel = lambda a, b: np.linalg.norm(a - b, axis=1) / np.linalg.norm(b, axis=1)
    print(f'{d}: {len(tokens)} positions (prompt {len(prompt)}); relative L2 error of a row of logits')
    print(f'{"scheme":>8} {"vs exact x: worst":>18} {"median":>9} {"vs HF: worst":>13} {"median":>9} {"argmax != HF":>13}')
    for s in schemes:
        lg = exact if s == 'none' else run(rounders[s])
        e1, e2 = rel(lg, exact), rel(lg, hf)
        flips = int(np.sum(np.argmax(lg[len(prompt) - 1:], axis=1) != np.array(gen)))
        print(f'{s:>8} {e1.max():18.2e} {np.median(e1):9.2e} {e2.max():13.2e} {np.median(e2):9.2e} {flips:13d}')


if __name__ == '__main__':
    main()
