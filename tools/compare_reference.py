#!/usr/bin/env python3
"""Compare deltaq's teacher-forced logits with a reference.safetensors made by mkfixture.py.
usage: compare_reference.py MODEL_DIR LOGITS.safetensors [BOUND]
The logits file is `deltaq score --ids <prompt_ids + generated_ids[:-1]>` output. Prints the
relative L2 error per row (worst first) and exits 1 if the worst exceeds BOUND (default 1e-4)."""
import json, struct, sys
import numpy as np

def load(path):
    with open(path, 'rb') as f:
        n = struct.unpack('<Q', f.read(8))[0]
        hdr = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, v in hdr.items():
        if k == '__metadata__':
            continue
        a, b = v['data_offsets']
        dt = {'F32': np.float32, 'I32': np.int32}[v['dtype']]
        out[k] = np.frombuffer(data[a:b], dt).reshape(v['shape'])
    return out

def ids_of(model_dir):
    r = load(model_dir + '/reference.safetensors')
    return list(r['prompt_ids']) + list(r['generated_ids'][:-1])

def main():
    if len(sys.argv) >= 2 and sys.argv[1] == '--ids':
        print(','.join(str(i) for i in ids_of(sys.argv[2])))
        return 0
    model_dir, logits_path = sys.argv[1], sys.argv[2]
    bound = float(sys.argv[3]) if len(sys.argv) > 3 else 1e-4
    r = load(model_dir + '/reference.safetensors')
    ref = np.vstack([r['prefill_logits'], r['decode_logits'][:-1]]).astype(np.float64)
    got = load(logits_path)['logits'].astype(np.float64)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    err = np.linalg.norm(got - ref, axis=1) / np.linalg.norm(ref, axis=1)
    greedy_ok = int(np.sum(got.argmax(1)[len(r['prompt_ids']) - 1:] == r['generated_ids'][:len(err) - len(r['prompt_ids']) + 1]))
    print(f"{model_dir}: {len(err)} rows, worst relative L2 error {err.max():.3e} (row {err.argmax()}), "
          f"median {np.median(err):.3e}, bound {bound:.0e}; argmax equal to HF's greedy ids at {greedy_ok} positions")
    return 0 if err.max() <= bound else 1

if __name__ == '__main__':
    sys.exit(main())
