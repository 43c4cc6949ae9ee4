"""Check a register-operand wgmma loop in SASS (benchmarks/NOTES.md items 50, 55, 94, 95): ptxas does not
keep an asynchronous wgmma's register A operand alive, so nothing may write those registers, nor touch
the accumulator, between the HGMMA and the WARPGROUP.DEPBAR that retires it. Traces the K loop that
holds the HGMMAs three times round and then its exit, keeps the in-flight HGMMA groups (each ends at a
`gsb0`) against each DEPBAR.LE, and reports every write to an in-flight group's A registers and every
access to an in-flight accumulator, with the groups' register sets.

    cuobjdump -sass kernel.cubin > kernel.sass
    python3 benchmarks/wgmma_operand_check.py kernel.sass ...

(Compile the probes' kernels for sm_90 offline with Triton's compiler, as gluon_moe.sm90_ptx does, and
take ``compiled.asm["cubin"]``; cuobjdump ships with Triton's NVIDIA backend.) A text check of one
loop's shape, not a proof: run it on every tile after any change to a kernel, to Triton or to ptxas.
"""
import re
import sys

def parse(path):
    ins = []
    for l in open(path):
        m = re.match(r"\s+/\*([0-9a-f]{4,5})\*/\s+(.*?)\s*;", l)
        if m: ins.append((int(m.group(1), 16), m.group(2)))
    return ins
def width(op):
    return 4 if '.128' in op else 2 if ('.64' in op or op.startswith('CS2R') or '.WIDE' in op or op.startswith('DADD') or op.startswith('DMUL')) else 1
NODST = ('HGMMA', 'ST', 'BAR', 'SYNCS', 'WARPGROUP', 'BRA', 'MEMBAR', 'FENCE', 'NOP', 'ARRIVES', 'LDGSTS', 'RED', 'EXIT', 'ATOM ', 'CCTL', 'ERRBAR', 'DEPBAR')
def regs(t):
    t = re.sub(r"^@!?U?P\w+\s+", "", t); op = t.split()[0]; rest = t[len(op):]
    ops = [o.strip() for o in rest.split(',')]
    dst = set(); src = set()
    has_dst = not op.startswith(NODST) and not op.startswith(('ISETP', 'FSETP', 'PLOP', 'HSETP', 'DSETP', 'VOTE', 'U'))
    w = width(op)
    for k, o in enumerate(ops):
        for m in re.finditer(r"(?<![A-Za-z_])R(\d+)", o):
            r = int(m.group(1)); n = w if (k == 0 or op.startswith(('ST', 'LDS', 'LDG'))) else 1
            rr = set(range(r, r + n))
            if k == 0 and has_dst and o.startswith('R'): dst |= rr
            else: src |= rr
    # STS/STG: first operand is an address -> src
    return op, dst, src
def check(path):
    ins = parse(path)
    addr = {a: i for i, (a, t) in enumerate(ins)}
    hg = [i for i, (a, t) in enumerate(ins) if t.startswith('HGMMA') or re.match(r"@!?P\w+ HGMMA", t)]
    # loop: backward branch whose target precedes the first HGMMA and which lies after the last HGMMA
    loops = []
    for i, (a, t) in enumerate(ins):
        m = re.search(r'BRA (0x[0-9a-f]+)', t)
        if m:
            tgt = int(m.group(1), 16)
            if tgt < a and tgt <= ins[hg[0]][0] and a >= ins[hg[-1]][0]: loops.append((addr[tgt], i))
    lo, hi = loops[0]
    exit_dep = next(i for i in range(hi + 1, len(ins)) if 'DEPBAR' in ins[i][1])
    end = next(i for i in range(exit_dep, len(ins)) if 'EXIT' in ins[i][1])
    trace = list(range(lo, hi + 1)) * 3 + list(range(hi + 1, end + 1))
    inflight = []   # list of groups: dict(A=set, acc=set, first=idx)
    cur = None
    bad = []; groups_seen = []
    for step, i in enumerate(trace):
        a, t = ins[i]
        op, dst, src = regs(t)
        body = re.sub(r"^@!?U?P\w+\s+", "", t)
        if body.startswith('HGMMA'):
            m = re.match(r"HGMMA\.(\d+)x(\d+)x16\.\S+ R(\d+), (R(\d+)|gdesc\[\w+\]), gdesc\[\w+\], (R\d+|RZ)", body)
            n = int(m.group(2)); acc0 = int(m.group(3))
            acc = set(range(acc0, acc0 + n // 2))
            A = set(range(int(m.group(5)), int(m.group(5)) + 4)) if m.group(5) else set()
            # an HGMMA into an accumulator other than an in-flight chain's must not overlap its A or acc
            for g in inflight + ([cur] if cur else []):
                if (acc & g['A']) or (A and A & g['acc']): bad.append(('HGMMA overlaps in-flight', hex(a), t))
            if cur is None: cur = dict(A=set(), acc=set(), first=a)
            cur['A'] |= A; cur['acc'] |= acc
            if 'gsb0' in body:
                inflight.append(cur); groups_seen.append((hex(cur['first']), min(cur['A']), max(cur['A']), min(cur['acc']), max(cur['acc']), tuple(sorted(cur['A'])))); cur = None
            continue
        m = re.match(r"WARPGROUP\.DEPBAR\.LE gsb0, 0x(\d+)", body)
        if m:
            n = int(m.group(1), 16)
            while len(inflight) > n: inflight.pop(0)
            continue
        live = inflight + ([cur] if cur else [])
        for g in live:
            if dst & g['A']: bad.append(('writes A', hex(a), t, hex(g['first'])))
            if (dst | src) & g['acc']: bad.append(('touches acc', hex(a), t, hex(g['first'])))
    uniq = sorted(set(groups_seen), key=lambda x: x[0])
    print(path, 'loop', hex(ins[lo][0]), hex(ins[hi][0]), 'groups:')
    for g in uniq: print('   HGMMA group @', g[0], 'A R%d..R%d' % (g[1], g[2]), 'count', len(g[5]), 'acc R%d..R%d' % (g[3], g[4]))
    As = [set(g[5]) for g in uniq]
    print('   A sets pairwise disjoint:', all(not (As[x] & As[y]) for x in range(len(As)) for y in range(x + 1, len(As))))
    print('   DEPBARs in loop:', [ins[i][1] for i in range(lo, hi + 1) if 'DEPBAR' in ins[i][1]], 'exit:', ins[exit_dep][1])
    print('   hazards:', sorted(set(bad)) if bad else 'none')


if __name__ == "__main__":
    for path in sys.argv[1:]:
        check(path)
