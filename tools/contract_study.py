"""How much accuracy a cheaper 4-bit unit would cost: a float64 forward of a 4-bit Qwen3.5
checkpoint (docs/qwen35.md) in which x is rounded the way a candidate numerics contract rounds it
before every 4-bit product, against the same forward with x exact and against the fixture's HF
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
import json, math, struct, sys
import numpy as np


def load_safetensors(path):
    with open(path, 'rb') as f:
        n = struct.unpack('<Q', f.read(8))[0]
        hdr = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, v in hdr.items():
        if k == '__metadata__':
            continue
        a, b = v['data_offsets']
        raw, dt = data[a:b], v['dtype']
        if dt == 'BF16':
            arr = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif dt == 'F32':
            arr = np.frombuffer(raw, np.float32)
        elif dt == 'U32':
            arr = np.frombuffer(raw, np.uint32)
        elif dt == 'I32':
            arr = np.frombuffer(raw, np.int32)
        else:
            raise SystemExit(f'{path}: tensor {k}: dtype {dt} not handled')
        out[k] = arr.reshape(v['shape'])
    return out


def rounder(scheme):
    """x -> x as the scheme's integers represent it (exactly: xi * 2^(E-P+1))."""
    if scheme == 'none':
        return lambda x: x
    block, p = (int(t) for t in scheme.split(':'))

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


class Model:
    def __init__(self, d):
        cfg = json.load(open(d + '/config.json'))
        self.tc = tc = cfg.get('text_config', cfg)
        if 'quantization' not in cfg:
            raise SystemExit(f'{d}: not an MLX 4-bit checkpoint (no "quantization" in config.json)')
        W = load_safetensors(d + '/model.safetensors')
        pre = 'language_model.model.'

        def mat(name):  # dequantized 4-bit matrix, float64
            w = W[name + '.weight']
            s = W[name + '.scales'].astype(np.float64)
            b = W[name + '.biases'].astype(np.float64)
            rows, words = w.shape
            gs = words * 8 // s.shape[1]
            q = np.zeros((rows, words * 8), np.float64)
            for k in range(8):
                q[:, k::8] = (w >> (4 * k)) & 15
            return (q.reshape(rows, -1, gs) * s[:, :, None] + b[:, :, None]).reshape(rows, words * 8)

        vec = lambda n: W[n].astype(np.float64)
        self.E = mat(pre + 'embed_tokens')
        self.head = self.E if tc.get('tie_word_embeddings', True) else mat('language_model.lm_head')
        self.final_norm = vec(pre + 'norm.weight')  # MLX stores 1 + w
        self.layers = []
        for i, t in enumerate(tc['layer_types']):
            p = f'{pre}layers.{i}.'
            e = {'type': t, 'in': vec(p + 'input_layernorm.weight'), 'post': vec(p + 'post_attention_layernorm.weight'),
                 'gate': mat(p + 'mlp.gate_proj'), 'up': mat(p + 'mlp.up_proj'), 'down': mat(p + 'mlp.down_proj')}
            if t == 'linear_attention':
                a = p + 'linear_attn.'
                e.update(qkv=mat(a + 'in_proj_qkv'), z=mat(a + 'in_proj_z'), b=mat(a + 'in_proj_b'),
                         a=mat(a + 'in_proj_a'), conv=vec(a + 'conv1d.weight')[:, :, 0], dt=vec(a + 'dt_bias'),
                         A=vec(a + 'A_log'), norm=vec(a + 'norm.weight'), out=mat(a + 'out_proj'))
            else:
                a = p + 'self_attn.'
                e.update(q=mat(a + 'q_proj'), k=mat(a + 'k_proj'), v=mat(a + 'v_proj'), o=mat(a + 'o_proj'),
                         qn=vec(a + 'q_norm.weight'), kn=vec(a + 'k_norm.weight'))
            self.layers.append(e)

    def run(self, tokens, rx):
        """Logits at every position of `tokens`, x rounded by rx before every 4-bit product."""
        tc = self.tc
        eps = tc['rms_norm_eps']
        nh, nkv, hd = tc['num_attention_heads'], tc['num_key_value_heads'], tc['head_dim']
        Hk, Hv = tc['linear_num_key_heads'], tc['linear_num_value_heads']
        Dk, Dv, KC = tc['linear_key_head_dim'], tc['linear_value_head_dim'], tc['linear_conv_kernel_dim']
        rp = tc.get('rope_parameters', {})
        theta = rp.get('rope_theta', tc.get('rope_theta', 1e7))
        Rd = int(hd * rp.get('partial_rotary_factor', tc.get('partial_rotary_factor', 0.25)))
        inv = theta ** (-np.arange(0, Rd, 2) / Rd)
        C = 2 * Hk * Dk + Hv * Dv
        rms = lambda x, w: x / np.sqrt(np.mean(x * x) + eps) * w
        silu = lambda x: x / (1 + np.exp(-x))
        sigm = lambda x: 1 / (1 + np.exp(-x))
        softplus = lambda x: np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20))))
        P = lambda w, x: w @ rx(x)  # a 4-bit product

        def rope(x, pos):
            ang = pos * inv
            c, s = np.cos(ang), np.sin(ang)
            h2 = Rd // 2
            y = x.copy()
            y[:h2] = x[:h2] * c - x[h2:Rd] * s
            y[h2:Rd] = x[h2:Rd] * c + x[:h2] * s
            return y

        conv = [np.zeros((KC - 1, C)) for _ in self.layers]
        S = [np.zeros((Hv, Dk, Dv)) for _ in self.layers]
        kc = [[] for _ in self.layers]
        vc = [[] for _ in self.layers]
        out = []
        for pos, tok in enumerate(tokens):
            h = self.E[tok].copy()
            for i, e in enumerate(self.layers):
                x = rms(h, e['in'])
                if e['type'] == 'linear_attention':
                    mixed = P(e['qkv'], x)
                    z = P(e['z'], x).reshape(Hv, Dv)
                    b, a = P(e['b'], x), P(e['a'], x)
                    buf = np.vstack([conv[i], mixed[None]])
                    u = silu(np.sum(e['conv'] * buf.T, axis=1))
                    conv[i] = buf[1:]
                    q = u[:Hk * Dk].reshape(Hk, Dk)
                    k = u[Hk * Dk:2 * Hk * Dk].reshape(Hk, Dk)
                    v = u[2 * Hk * Dk:].reshape(Hv, Dv)
                    beta, g = sigm(b), -np.exp(e['A']) * softplus(a + e['dt'])
                    q = q / np.sqrt(np.sum(q * q, 1, keepdims=True) + 1e-6) / math.sqrt(Dk)
                    k = k / np.sqrt(np.sum(k * k, 1, keepdims=True) + 1e-6)
                    r = Hv // Hk
                    o = np.zeros((Hv, Dv))
                    for j in range(Hv):
                        St = S[i][j]
                        St *= math.exp(g[j])
                        delta = beta[j] * (v[j] - St.T @ k[j // r])
                        St += np.outer(k[j // r], delta)
                        o[j] = St.T @ q[j // r]
                    y = np.stack([rms(o[j], e['norm']) * silu(z[j]) for j in range(Hv)]).reshape(-1)
                    h = h + P(e['out'], y)
                else:
                    qg = P(e['q'], x).reshape(nh, 2 * hd)
                    gate = qg[:, hd:].reshape(-1)
                    q = np.stack([rope(rms(qg[j, :hd], e['qn']), pos) for j in range(nh)])
                    k = np.stack([rope(rms(kk, e['kn']), pos) for kk in P(e['k'], x).reshape(nkv, hd)])
                    kc[i].append(k)
                    vc[i].append(P(e['v'], x).reshape(nkv, hd))
                    Ks, Vs = np.stack(kc[i]), np.stack(vc[i])
                    o = np.zeros((nh, hd))
                    for j in range(nh):
                        sc = Ks[:, j // (nh // nkv)] @ q[j] / math.sqrt(hd)
                        pr = np.exp(sc - sc.max())
                        o[j] = (pr / pr.sum()) @ Vs[:, j // (nh // nkv)]
                    h = h + P(e['o'], o.reshape(-1) * sigm(gate))
                y = rms(h, e['post'])
                h = h + P(e['down'], silu(P(e['gate'], y)) * P(e['up'], y))
            out.append(P(self.head, rms(h, self.final_norm)))
        return np.stack(out)


def main():
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    d = sys.argv[1]
    schemes = sys.argv[2:] or ['none', '8:22', '8:16', '8:15', '8:14', '8:12', '64:22', '64:15']
    ref = load_safetensors(d + '/reference.safetensors')
    prompt, gen = list(ref['prompt_ids']), list(ref['generated_ids'])
    hf = np.vstack([ref['prefill_logits'], ref['decode_logits'][:-1]]).astype(np.float64)
    tokens = prompt + gen[:-1]
    model = Model(d)
    exact = model.run(tokens, rounder('none'))
    rel = lambda a, b: np.linalg.norm(a - b, axis=1) / np.linalg.norm(b, axis=1)
    print(f'{d}: {len(tokens)} positions (prompt {len(prompt)}); relative L2 error of a row of logits')
    print(f'{"scheme":>8} {"vs exact x: worst":>18} {"median":>9} {"vs HF: worst":>13} {"median":>9} {"argmax != HF":>13}')
    for s in schemes:
        lg = exact if s == 'none' else model.run(tokens, rounder(s))
        e1, e2 = rel(lg, exact), rel(lg, hf)
        flips = int(np.sum(np.argmax(lg[len(prompt) - 1:], axis=1) != np.array(gen)))
        print(f'{s:>8} {e1.max():18.2e} {np.median(e1):9.2e} {e2.max():13.2e} {np.median(e2):9.2e} {flips:13d}')


if __name__ == '__main__':
    main()
