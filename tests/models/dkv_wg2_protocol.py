# A model of the wg2 dk/dv CTA's protocol (kernels/dflash_attention.cu, dkv_wg2_sm90 with wg2_sched; and the
# forward's fwd_ws_sm90_kernel, whose runs are the pipelined schedule), to check a schedule for deadlocks before a GPU
# runs it: a producer filling a ring of S stages (full/empty mbarriers with
# phases), two consumers walking the same steps, each seeing a random subset (every step seen by one at least, as
# gather_blocks' lists), with the pipelined schedule (a step's stage released behind the next seen step's first issue,
# before a skipped step, or at the end) and the turn-taking one (named barriers: a bar.sync completes on the other's
# bar.arrive; consumer 1 hands consumer 0 the first turn). Random interleavings of the three actors; a walk where none
# can move before all are done is a deadlock. Exits 1 when any walk of any schedule did not finish.
#   python3 tests/models/dkv_wg2_protocol.py
# (Holding a pending stage over skipped steps deadlocks ~half the walks at S = 3; a skipping consumer that takes no
# turns, ~80%: the model finds both.)
import random, sys

def run(steps, sees, S, pipelined, turns, rng, fwd=False):
    # mbarrier: count of arrivals in the current phase, phase number
    full = [[0, 0] for _ in range(S)]   # producer arrivals needed: 1 (the model's producer is one actor)
    empty = [[0, 0] for _ in range(S)]  # consumer arrivals needed: 2
    def arrive(bar, need):
        bar[0] += 1
        if bar[0] == need: bar[0] = 0; bar[1] += 1
    def done_phase(bar, k):  # has phase k (0-based count of completions) completed
        return bar[1] > k
    # named barriers for turns: bar[c] counts arrivals from the other (arrive) and waits (sync) of c
    tb = [[0, 0], [0, 0]]  # [arrivals by other not yet consumed, unused]
    # producer state
    p = {'t': 0}
    cons = [{'t': 0, 'pc': 'wait_full', 'pending': -1, 'turn': 0, 'head': c == 1} for c in range(2)]
    fills = [0] * S  # how many fills stage has had
    def producer_step():
        t = p['t']
        if t >= steps: return False
        s = t % S
        if t >= S and not done_phase(empty[s], t // S - 1): return False
        arrive(full[s], 1); p['t'] += 1
        return True
    def turn_sync(c):
        if tb[c][0] > 0: tb[c][0] -= 1; return True
        return False
    def turn_arrive(c):
        tb[1 - c][0] += 1
    def cons_step(c):
        st = cons[c]
        if st['head']:  # consumer 1 hands consumer 0 the first turn
            if turns: turn_arrive(c)
            st['head'] = False; return True
        t = st['t']
        pc = st['pc']
        if pc == 'end':
            if pipelined and st['pending'] >= 0:
                arrive(empty[st['pending']], 2); st['pending'] = -1; return True
            return False
        if t >= steps:
            st['pc'] = 'end'; return True
        s = t % S
        if pc == 'wait_full':
            if not done_phase(full[s], t // S): return False
            st['pc'] = 'seen' if sees[c][t] else 'skip'; st['sub'] = 0; return True
        if pc == 'seen':
            sub = st['sub']
            if sub == 0:  # turn 1 begin
                if turns and not turn_sync(c): return False
                st['sub'] = 1; return True
            if sub == 1:  # issue S; pipelined (dk/dv): wait for previous dV/dK, release its stage
                if pipelined and not fwd and st['pending'] >= 0:
                    arrive(empty[st['pending']], 2); st['pending'] = -1
                st['sub'] = 2; return True
            if sub == 2:  # issue dP (the forward: the last tile's P·V), turn end
                if turns: turn_arrive(c)
                st['sub'] = 3; return True
            if sub == 3:  # the forward: softmax, wait for the last P·V, release its stage (outside the turn)
                if pipelined and fwd and st['pending'] >= 0:
                    arrive(empty[st['pending']], 2); st['pending'] = -1
                st['sub'] = 5 if fwd else 4; return True
            if sub == 4:  # math, turn 2 begin; issue dV dK, turn end
                if turns and not st.get('t2'):
                    if not turn_sync(c): return False
                    st['t2'] = True; return True
                if turns: turn_arrive(c)
                st['t2'] = False
                st['sub'] = 5; return True
            if sub == 5:  # release or hold
                if pipelined: st['pending'] = s
                else: arrive(empty[s], 2)
                st['t'] += 1; st['pc'] = 'wait_full'; return True
        if pc == 'skip':
            sub = st['sub']
            if pipelined and st['pending'] >= 0:
                arrive(empty[st['pending']], 2); st['pending'] = -1; return True
            if turns and sub < (2 if fwd else 4):
                if sub % 2 == 0:
                    if not turn_sync(c): return False
                else:
                    turn_arrive(c)
                st['sub'] += 1; return True
            arrive(empty[s], 2)
            st['t'] += 1; st['pc'] = 'wait_full'; return True
        raise Exception(pc)
    actors = [producer_step, lambda: cons_step(0), lambda: cons_step(1)]
    for _ in range(100000):
        order = list(range(3)); rng.shuffle(order)
        moved = False
        for a in order:
            if actors[a](): moved = True; break
        if not moved:
            fin = p['t'] >= steps and all(cc['pc'] == 'end' and cc['pending'] < 0 for cc in cons)
            return 'ok' if fin else 'deadlock'
    return 'long'

rng = random.Random(1)
res = {}
# (S, pipelined, turns, a step may be seen by no consumer): the dk/dv rows (gather_blocks lists only blocks some
# consumer sees; two turns a step, the pipelined release inside the first), and the forward's fwd_ws_sm90_kernel (4
# stages, its runs = the pipelined schedule: a tile's stage released behind the next seen tile's S and P·V, outside
# its turn, or before a skipped tile; one turn a walk tile; a walk tile between the CTA rows' intervals may be seen by
# neither warpgroup)
for S, pipelined, turns, unseen in ((3, False, False, False), (3, False, True, False), (3, True, False, False),
                                    (4, False, False, False), (4, False, True, False), (4, True, False, False),
                                    (4, True, False, True), (4, True, True, True)):
    bad = 0
    for w in range(3000):
        steps = rng.randint(1, 14)
        sees = [[False] * steps, [False] * steps]
        for t in range(steps):
            k = rng.randint(0 if unseen else 1, 3)
            sees[0][t] = k & 1 == 1; sees[1][t] = k & 2 == 2
        r = run(steps, sees, S, pipelined, turns, rng, fwd=unseen)
        if r != 'ok': bad += 1
    what = (f"the forward's runs{' with turns' if turns else ''}" if unseen else
            f"pipelined={pipelined} turns={turns}")
    print(f"S={S} {what}: {bad} of 3000 walks did not finish")
    res[(S, pipelined, turns, unseen)] = bad
sys.exit(1 if any(res.values()) else 0)
