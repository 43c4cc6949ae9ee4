"""Check a register-operand wgmma loop in SASS (benchmarks/NOTES.md items 50, 55, 94, 95): ptxas does not
keep an asynchronous wgmma's register A operand alive, so nothing may write those registers, nor touch
the accumulator, between the HGMMA and the WARPGROUP.DEPBAR that retires it. Traces the K loop that
holds the HGMMAs three times round and then its exit path (unconditional branches taken), keeps the in-flight HGMMA groups (each ends at a
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

# instructions without a register destination (stores, barriers, branches, fences, the HGMMA itself,
# predicate and uniform-register writers)
NO_DESTINATION = ('HGMMA', 'ST', 'BAR', 'SYNCS', 'WARPGROUP', 'BRA', 'MEMBAR', 'FENCE', 'NOP', 'ARRIVES', 'LDGSTS',
                  'RED', 'EXIT', 'ATOM ', 'CCTL', 'ERRBAR', 'DEPBAR', 'ISETP', 'FSETP', 'PLOP', 'HSETP', 'DSETP',
                  'VOTE', 'U')


def parse(sass: str) -> list:
    """(address, instruction) pairs of cuobjdump -sass text."""
    ins = []
    for line in sass.splitlines():
        m = re.match(r"\s+/\*([0-9a-f]{4,5})\*/\s+(.*?)\s*;", line)
        if m:
            ins.append((int(m.group(1), 16), m.group(2)))
    return ins


def width(op: str) -> int:
    """Registers a destination operand spans."""
    if '.128' in op:
        return 4
    wide = '.64' in op or '.WIDE' in op or op.startswith(('CS2R', 'DADD', 'DMUL'))
    return 2 if wide else 1


def regs(t: str) -> tuple:
    """(opcode, registers written, registers read) of one instruction (its predicate dropped)."""
    t = re.sub(r"^@!?U?P\w+\s+", "", t)
    op = t.split()[0]
    ops = [o.strip() for o in t[len(op):].split(',')]
    dst, src = set(), set()
    has_dst = not op.startswith(NO_DESTINATION)
    w = width(op)
    for k, o in enumerate(ops):
        for m in re.finditer(r"(?<![A-Za-z_])R(\d+)", o):
            r = int(m.group(1))
            n = w if (k == 0 or op.startswith(('ST', 'LDS', 'LDG'))) else 1
            if k == 0 and has_dst and o.startswith('R'):
                dst |= set(range(r, r + n))
            else:  # (a store's first operand is its address)
                src |= set(range(r, r + n))
    return op, dst, src


def analyze(sass: str) -> dict:
    """The K loop's HGMMA groups (first address, A registers, accumulator registers; with those of a tile
    after the loop), whether their A register sets are pairwise disjoint, the loop's DEPBARs, and the
    hazards found (empty: none)."""
    ins = parse(sass)
    addr = {a: i for i, (a, t) in enumerate(ins)}
    hg = [i for i, (a, t) in enumerate(ins) if t.startswith('HGMMA') or re.match(r"@!?P\w+ HGMMA", t)]
    # loop: backward branch whose target precedes the first HGMMA and whose body holds HGMMAs (a K loop with
    # one more tile after its pairs has an HGMMA past the branch too)
    loops = []
    for i, (a, t) in enumerate(ins):
        m = re.search(r'BRA (0x[0-9a-f]+)', t)
        if m:
            tgt = int(m.group(1), 16)
            if tgt < a and tgt <= ins[hg[0]][0] and any(addr[tgt] <= h <= i for h in hg):
                loops.append((addr[tgt], i))
    lo, hi = loops[0]
    # the exit: the path from the loop's branch to the first EXIT, taking unconditional branches (past the
    # code of a loop run zero times, say); its last DEPBAR retires every wgmma
    exit_path, i = [], hi + 1
    while 'EXIT' not in ins[i][1] and len(exit_path) < len(ins):
        exit_path.append(i)
        jump = re.match(r"BRA (0x[0-9a-f]+)", ins[i][1])  # (no predicate: always taken)
        i = addr[int(jump.group(1), 16)] if jump else i + 1
    exit_dep = max(i for i in exit_path if 'DEPBAR' in ins[i][1])
    trace = list(range(lo, hi + 1)) * 3 + exit_path + [i]
    inflight = []  # groups: dict(A=set, acc=set, first=address)
    cur = None
    bad, groups_seen = [], []
    for i in trace:
        a, t = ins[i]
        op, dst, src = regs(t)
        body = re.sub(r"^@!?U?P\w+\s+", "", t)
        if body.startswith('HGMMA'):
            m = re.match(r"HGMMA\.(\d+)x(\d+)x16\.\S+ R(\d+), (R(\d+)|gdesc\[\w+\]), gdesc\[\w+\], (R\d+|RZ)", body)
            n = int(m.group(2))
            acc0 = int(m.group(3))
            acc = set(range(acc0, acc0 + n // 2))
            A = set(range(int(m.group(5)), int(m.group(5)) + 4)) if m.group(5) else set()
            # an HGMMA into an accumulator other than an in-flight chain's must not overlap its A or acc
            for g in inflight + ([cur] if cur else []):
                if (acc & g['A']) or (A and A & g['acc']):
                    bad.append(('HGMMA overlaps in-flight', hex(a), t))
            if cur is None:
                cur = dict(A=set(), acc=set(), first=a)
            cur['A'] |= A
            cur['acc'] |= acc
            if 'gsb0' in body:
                inflight.append(cur)
                groups_seen.append((hex(cur['first']), tuple(sorted(cur['A'])), tuple(sorted(cur['acc']))))
                cur = None
            continue
        m = re.match(r"WARPGROUP\.DEPBAR\.LE gsb0, 0x(\d+)", body)
        if m:
            n = int(m.group(1), 16)
            while len(inflight) > n:
                inflight.pop(0)
            continue
        for g in inflight + ([cur] if cur else []):
            if dst & g['A']:
                bad.append(('writes A', hex(a), t, hex(g['first'])))
            if (dst | src) & g['acc']:
                bad.append(('touches acc', hex(a), t, hex(g['first'])))
    groups = sorted(set(groups_seen))
    a_sets = [set(a) for a in sorted({g[1] for g in groups})]  # (a tile after the loop reuses one of its sets)
    return dict(loop=(hex(ins[lo][0]), hex(ins[hi][0])), groups=groups,
                disjoint=all(not (a_sets[x] & a_sets[y]) for x in range(len(a_sets)) for y in range(x + 1, len(a_sets))),
                depbars=[ins[i][1] for i in range(lo, hi + 1) if 'DEPBAR' in ins[i][1]], exit_depbar=ins[exit_dep][1],
                hazards=sorted(set(bad)))


def main() -> None:
    for path in sys.argv[1:]:
        with open(path) as f:
            r = analyze(f.read())
        print(path, 'loop', *r['loop'], 'groups:')
        for first, a, acc in r['groups']:
            print('   HGMMA group @', first, 'A R%d..R%d' % (a[0], a[-1]), 'count', len(a), 'acc R%d..R%d' % (acc[0], acc[-1]))
        print('   A sets pairwise disjoint:', r['disjoint'])
        print('   DEPBARs in loop:', r['depbars'], 'exit:', r['exit_depbar'])
        print('   hazards:', r['hazards'] or 'none')


if __name__ == "__main__":
    main()
