#!/usr/bin/env bash
# Does a scrape flood on /metrics slow the commit path? (issue 22) The CPU demo job (deploy/demo.ini's model and
# training settings, its target made by `dflash-demo make-target --kind repeat`, no evaluation worker, no
# checkpoints) runs with control.metrics_listen on a loopback port, alternately idle (nobody scrapes) and under a
# flood: SCRAPERS clients (at most 16, dflashd's connection limit) on 127.0.0.1, each a keep-alive connection asking
# GET /metrics back to back without pause (or, with RATE set, RATE scrapes/s in all, spread over the scrapers: a
# Prometheus scraping every 15 s makes 0.07/s), from the job's start until its end (or FLOOD_MAX_SEC). A poller notes when
# each step's ledger line appears; the commit interval is the mean over the steps after WARM (the job's start and
# warm-up left out), with the median beside it. Also per run: dflashd's CPU seconds, its largest thread count and
# resident memory (sampled), the scrapes answered and the scrapers' own CPU seconds. A benchmark, not a test: nothing is asserted. On a machine
# with few cores the scrapers' own CPU competes with the job's workers as well: dflashd's CPU seconds say what the
# flood cost dflashd itself.
# usage: BUILD=build STEPS=300 WARM=20 SCRAPERS=8 RATE=0 REPEAT=2 bench/metrics_flood.sh
cd "$(dirname "$0")/.." || exit 1
. tests/system/lib.bash
STEPS=${STEPS:-300}
WARM=${WARM:-20}
SCRAPERS=${SCRAPERS:-8}
REPEAT=${REPEAT:-2}
RATE=${RATE:-0}
FLOOD_MAX_SEC=${FLOOD_MAX_SEC:-600}
[ "$SCRAPERS" -ge 1 ] && [ "$SCRAPERS" -le 16 ] || { echo "SCRAPERS must be 1..16 (dflashd serves 16 connections)" >&2; exit 2; }
"$BIN/dflash-demo" make-target "$T/target" --seed 7 --kind repeat --period 8 >/dev/null 2>>"$T/fixture.log" &&
prepared_data "$T/target" "$T/data" --samples 256 --seed 7 ||
    { echo "fixture failed: $(tail -3 "$T/fixture.log")" >&2; exit 1; }
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

config() { demo_config "$1" "$STEPS" train.checkpoint_every=0 control.metrics_listen="127.0.0.1:$PORT"; } # NAME

# watch.py LEDGER OUT KEEPER_CFG [SCRAPERS]: polls the ledger (2 ms) until STEPS lines, samples dflashd's
# /proc (CPU, threads, RSS) and runs the scrapers meanwhile; writes one JSON line of results to OUT
cat >"$T/watch.py" <<'EOP'
import json, multiprocessing as mp, os, socket, statistics, sys, time, http.client
ledger, out, cfg, scrapers, steps, warm, port, max_sec, rate = sys.argv[1], sys.argv[2], sys.argv[3], \
    int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7]), float(sys.argv[8]), float(sys.argv[9])

def scrape(stop, counts, i):
    ok = bad = err = 0
    conn = None
    period = scrapers / rate if rate > 0 else 0
    while not stop.is_set(): # dflashd listening: the errors counted are those of the flood
        try: socket.create_connection(("127.0.0.1", port), timeout=5).close(); break
        except OSError: time.sleep(0.01)
    next_at = time.monotonic() + period * i / max(scrapers, 1)
    while not stop.is_set():
        if period:
            next_at += period
            time.sleep(max(0, next_at - time.monotonic()))
            if stop.is_set(): break
        try:
            if conn is None:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/metrics")
            r = conn.getresponse()
            r.read()
            if r.status == 200: ok += 1
            else: bad += 1
            if r.will_close: conn.close(); conn = None
        except (OSError, http.client.HTTPException):
            err += 1
            if conn: conn.close()
            conn = None
            time.sleep(0.01)
    counts[3 * i], counts[3 * i + 1], counts[3 * i + 2] = ok, bad, err

def keeper_pid():
    for p in os.listdir("/proc"):
        if not p.isdigit(): continue
        try: cmd = open("/proc/%s/cmdline" % p, "rb").read().split(b"\0")
        except OSError: continue
        if cmd and cmd[0].endswith(b"dflashd") and cfg.encode() in cmd: return int(p)
    return None

stop = mp.Event()
counts = mp.Array("q", 3 * max(scrapers, 1))
procs = [mp.Process(target=scrape, args=(stop, counts, i)) for i in range(scrapers)]
t0 = time.monotonic()
for p in procs: p.start()
seen, commits, pid, cpu, threads, rss = 0, [], None, 0.0, 0, 0
tick = os.sysconf("SC_CLK_TCK")
last_proc = 0
while seen < steps and time.monotonic() - t0 < max_sec:
    try:
        with open(ledger, "rb") as f: n = f.read().count(b"\n")
    except OSError: n = 0
    now = time.monotonic()
    commits += [now] * (n - seen)
    seen = max(seen, n)
    if now - last_proc > 0.2:
        last_proc = now
        pid = pid or keeper_pid()
        try:
            st = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
            cpu = (int(st[11]) + int(st[12])) / tick
            s = dict(l.split(":", 1) for l in open("/proc/%d/status" % pid))
            threads = max(threads, int(s["Threads"])); rss = max(rss, int(s["VmRSS"].split()[0]))
        except (OSError, TypeError, KeyError, ValueError): pass
    time.sleep(0.002)
flood_sec = time.monotonic() - t0
stop.set()
for p in procs: p.join()
scrapers_cpu = os.times().children_user + os.times().children_system # the scrapers' processes, joined
iv = [b - a for a, b in zip(commits[warm:], commits[warm + 1:])]
res = {"steps": seen, "mean_ms": 1e3 * (commits[-1] - commits[warm]) / (len(commits) - 1 - warm) if len(iv) else None,
       "median_ms": 1e3 * statistics.median(iv) if iv else None,
       "keeper_cpu_s": cpu, "keeper_threads_max": threads, "keeper_rss_max_kib": rss,
       "scrapes_ok": sum(counts[0::3]), "scrapes_not_200": sum(counts[1::3]), "connection_errors": sum(counts[2::3]),
       "scrapers_cpu_s": scrapers_cpu, "seconds": flood_sec}
json.dump(res, open(out, "w"))
EOP

run() { # NAME SCRAPERS
    config "$1"
    "$BIN/dflash" run -c "$T/$1.ini" >"$T/$1.out" 2>&1 &
    local sup=$!
    python3 "$T/watch.py" "$T/$1/ledger.jsonl" "$T/$1.json" "$T/$1.ini" "$2" "$STEPS" "$WARM" "$PORT" "$FLOOD_MAX_SEC" "$RATE"
    wait $sup || { echo "$1: the job failed: $(tail -3 "$T/$1.out")" >&2; exit 1; }
    python3 - "$T/$1.json" "$1" <<'EOP'
import json, sys
r = json.load(open(sys.argv[1]))
line = "%-8s %d steps: commit interval mean %.1f ms (%.2f steps/s), median %.1f ms; dflashd %.2f s CPU, <= %d threads, <= %d KiB RSS" % (
    sys.argv[2], r["steps"], r["mean_ms"], 1e3 / r["mean_ms"], r["median_ms"], r["keeper_cpu_s"], r["keeper_threads_max"],
    r["keeper_rss_max_kib"])
if r["scrapes_ok"] or r["scrapes_not_200"] or r["connection_errors"]:
    line += "; %d scrapes answered 200 (%.0f/s), %d other statuses, %d connection errors; the scrapers %.1f s CPU" % (
        r["scrapes_ok"], r["scrapes_ok"] / r["seconds"], r["scrapes_not_200"], r["connection_errors"], r["scrapers_cpu_s"])
print(line)
EOP
}

echo "metrics flood: $STEPS steps per run (interval over steps $WARM..$STEPS), $SCRAPERS scrapers ($([ "$RATE" = 0 ] && echo "back to back" || echo "$RATE scrapes/s in all")), $REPEAT rounds, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq "$REPEAT"); do
    run "idle-$r" 0
    run "flood-$r" "$SCRAPERS"
done
python3 - "$T" "$REPEAT" <<'EOP'
import json, sys
w, n = sys.argv[1], int(sys.argv[2])
get = lambda k: [json.load(open("%s/%s-%d.json" % (w, k, r + 1))) for r in range(n)]
idle, flood = get("idle"), get("flood")
mi = sum(r["mean_ms"] for r in idle) / n
mf = sum(r["mean_ms"] for r in flood) / n
ci = sum(r["keeper_cpu_s"] for r in idle) / n
cf = sum(r["keeper_cpu_s"] for r in flood) / n
rate = sum(r["scrapes_ok"] / r["seconds"] for r in flood) / n
pairs = " ".join("%.2f" % (f["mean_ms"] / i["mean_ms"]) for i, f in zip(idle, flood))
print("mean commit interval: idle %.1f ms, flood %.1f ms: flood/idle %.3f (each round: %s; steps/s %.2f vs %.2f); dflashd "
      "CPU %.2f s vs %.2f s (+%.2f s for %.0f scrapes/s)" % (mi, mf, mf / mi, pairs, 1e3 / mi, 1e3 / mf, ci, cf, cf - ci, rate))
EOP
