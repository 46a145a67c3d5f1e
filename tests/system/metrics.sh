#!/usr/bin/env bash
# Watching a job with the tools operators and ML engineers run (issue 22, parts 2 and 3): dflashd's /metrics on
# control.metrics_listen passes `promtool check metrics`, has every figure `dflashctl status --json` has, answers a
# malformed request with an HTTP error and keeps serving; a real Prometheus server scrapes the running job and its
# query API returns the step; a non-loopback or malformed metrics_listen is refused at start naming the setting.
# With metrics.tensorboard the job writes a TensorBoard event file whose framing and CRCs our reader checks and whose
# scalars equal metrics.jsonl's, step by step (tests/gpu/tensorboard_check.py checks it with TensorBoard itself).
cd "$(dirname "$0")/../.." || exit 1
. tests/system/lib.bash
DUMP=${BUILD:-build}/tests/system/tfevents_dump
for tool in curl promtool prometheus; do
    command -v $tool >/dev/null || { echo "skipped: $tool not installed (make deps installs it)"; exit 77; }
done
make_fixture || { fail metrics_fixture "$(tail -3 "$T/fixture.log")"; exit 1; }
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
MPORT=$(free_port)
PPORT=$(free_port)

# a metrics_listen that is not a loopback address:port: dflashd refuses to start, naming the setting
for bad in 0.0.0.0:$MPORT 10.0.0.1:$MPORT 127.0.0.1 127.0.0.1:0 localhost:http; do
    write_config bad 5 "[control]
metrics_listen = $bad"
    "$BIN/dflashd" -c "$T/bad.ini" >"$T/bad.out" 2>&1
    rc=$?
    if [ $rc -ne 0 ] && grep -q "control.metrics_listen = \"$bad\"" "$T/bad.out"; then
        ok "metrics_listen_refused ($bad: $(grep -o 'control.metrics_listen.*' "$T/bad.out" | head -1 | cut -c1-110))"
    else fail "metrics_listen_refused ($bad)" "exit $rc: $(tail -2 "$T/bad.out")"; fi
    rm -rf "$T/bad"
done

write_config obs 1000000 "[control]
metrics_listen = 127.0.0.1:$MPORT
[metrics]
tensorboard = true"
sed -i -e 's/^checkpoint_every = .*/checkpoint_every = 0/' "$T/obs.ini"
ctl() { "$BIN/dflashctl" -c "$T/obs.ini" --wait 120 "$@"; }
URL=http://127.0.0.1:$MPORT/metrics
"$BIN/dflash" run -c "$T/obs.ini" >"$T/obs.out" 2>&1 &
sup=$!
mstep() { curl -sf --max-time 5 "$URL" | awk '$1 == "dflash_step" { print $2 }'; }
deadline=$((SECONDS + 90))
until [ "$(mstep 2>/dev/null)" -gt 3 ] 2>/dev/null; do
    [ $SECONDS -lt $deadline ] && kill -0 $sup 2>/dev/null || break
    sleep 0.2
done
if ! curl -sf --max-time 5 -D "$T/headers" -o "$T/metrics.txt" "$URL" || ! [ "$(mstep)" -gt 3 ] 2>/dev/null; then
    fail metrics_served "no /metrics at $URL with a step above 3 within 90 s: $(tail -3 "$T/obs.out")"
    exit 1
fi
ok "metrics_served (step $(awk '$1 == "dflash_step" { print $2 }' "$T/metrics.txt"), $(wc -l <"$T/metrics.txt") lines)"
if grep -qi '^content-type: text/plain; version=0.0.4' "$T/headers"; then ok metrics_content_type
else fail metrics_content_type "$(grep -i content-type "$T/headers")"; fi
if out=$(promtool check metrics <"$T/metrics.txt" 2>&1); then ok "metrics_promtool_check${out:+ ($out)}"
else fail metrics_promtool_check "$out"; fi

# every figure of dflashctl status --json is in /metrics: compare them, both read at one held step (paused)
ctl pause >/dev/null
ctl status --json >"$T/status.json"
sleep 0.6 # > METRICS_HTTP_PUBLISH_SEC: the snapshot is taken after the pause held
curl -sf --max-time 5 "$URL" >"$T/metrics_held.txt"
if out=$(python3 - "$T/status.json" "$T/metrics_held.txt" <<'EOP'
import json, sys
d = json.load(open(sys.argv[1]))
m = {}
for line in open(sys.argv[2]):
    if line.startswith("#") or not line.strip(): continue
    name, v = line.rsplit(" ", 1)
    m[name] = float(v)
def w(metric, x, **extra):
    lab = 'role="%s",worker="%s"' % (x["role"], x["name"])
    for k, v in extra.items(): lab += ',%s="%s"' % (k, v)
    return "%s{%s}" % (metric, lab)
want = {"dflash_step": d["step"], "dflash_total_steps": d["total_steps"], "dflash_ledger_steps": d["ledger_steps"],
        "dflash_loss": d["loss"], "dflash_simulated_acceptance_length": d["acceptance"],
        "dflash_slot_accuracy_ratio": d["slot_accuracy"], "dflash_skipped_steps_total": d["skipped_steps"],
        "dflash_paused": int(d["paused"]), "dflash_held": int(d["held"]), "dflash_finished": int(d["finished"]),
        "dflash_batches_issued_total": d["next_batch"], "dflash_keeper_pid": d["keeper_pid"]}
for i, a in enumerate(d["slot_accuracies"]): want['dflash_slot_accuracy_by_slot_ratio{slot="%d"}' % (i + 1)] = a
for r, lab in [(d["token_ring"], 'ring="token-ring"')] + [(p, 'pool="%s"' % p["name"]) for p in d["pools"]]:
    base = "dflash_token_ring" if lab.startswith("ring") else "dflash_pool"
    want["%s_capacity_slots{%s}" % (base, lab)] = r["slots"]
    for st in ("free", "filling", "ready", "leased"):
        want['%s_slots{%s,state="%s"}' % (base, lab, st)] = r[st]
for x in d["workers"]:
    want[w("dflash_worker_restarts_total", x)] = x["restarts"]
    want[w("dflash_worker_tokens_total", x)] = x["tokens"]
    want[w("dflash_worker_batches_total", x)] = x["batches"]
    want[w("dflash_worker_pid", x)] = x["pid"]
    want[w("dflash_worker_state", x, state=x["state"])] = 1
    want[w("dflash_worker_tokens_per_second", x)] = None # a rate: present, its value moves
errs = []
for k, v in want.items():
    if k not in m: errs.append("%s missing" % k)
    elif v is not None and abs(m[k] - v) > 1e-9 * max(1, abs(v)): errs.append("%s = %g, status says %g" % (k, m[k], v))
print("; ".join(errs) if errs else "%d figures of status --json equal (step %d, %d workers, %d slots)" % (
      len(want), d["step"], len(d["workers"]), len(d["slot_accuracies"])))
sys.exit(1 if errs else 0)
EOP
); then ok "metrics_equal_status_json ($out)"; else fail metrics_equal_status_json "$out"; fi
ctl resume >/dev/null

# malformed requests get an HTTP error, and the endpoint keeps serving
code() { curl -s --max-time 5 -o /dev/null -w '%{http_code}' "$@"; }
c1=$(code -X POST -d x=1 "$URL"); c2=$(code "http://127.0.0.1:$MPORT/nothing"); c3=$(code -X DELETE "$URL")
# raw requests: what each got (the 40000-byte URL: 414, or "closed" when the peer's reset of the unread request
# reaches the client before the 414 does: either is an answer, the check after is that dflashd goes on serving)
# raw requests: what each got (the status line, or "closed": bytes that are no HTTP request line at all get the
# connection closed, as libmicrohttpd does)
raw=$(python3 - "$MPORT" <<'EOP'
import socket, sys
def raw(payload):
    s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5)
    data = b""
    try:
        s.sendall(payload)
        s.shutdown(socket.SHUT_WR)
        while True:
            b = s.recv(4096)
            if not b: break
            data += b
    except OSError:
        pass
    return data.split(b"\r\n", 1)[0].decode("latin-1").split(" ")[1] if data else "closed"
cases = [b"GARBAGE\r\n\r\n", b"\x00\x01\x02\xff\r\n\r\n", b"GARBAGE / HTTP/1.1\r\nHost: x\r\n\r\n",
         b"GET /metrics HTTP/9.9\r\nHost: x\r\n\r\n", b"GET /metrics\r\n\r\n",
         b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
         b"GET /metrics HTTP/1.1\r\nHost: x\r\nBad Header Line\r\n\r\n",
         b"GET /" + b"a" * 40000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"]
print(" ".join(raw(c) for c in cases))
EOP
)
after=$(mstep)
if [ "$c1" = 405 ] && [ "$c2" = 404 ] && [ "$c3" = 405 ] && [[ "$raw" =~ ^"closed closed 405 505 400 400 400 "(414|closed)" 200"$ ]] &&
   [ -n "$after" ]; then
    ok "metrics_malformed_requests_get_errors (POST $c1, /nothing $c2, DELETE $c3; raw: $raw; then step $after)"
else fail metrics_malformed_requests_get_errors "POST $c1, /nothing $c2, DELETE $c3, raw: '$raw', after: '$after'"; fi
# more connections than the limit at once: the rest are turned away, dflashd keeps serving
for i in $(seq 40); do curl -s --max-time 5 -o /dev/null "$URL" & done 2>/dev/null
wait $(jobs -p | grep -v "^$sup\$") 2>/dev/null
if [ -n "$(mstep)" ] && kill -0 $sup 2>/dev/null; then ok "metrics_connection_flood_survived (step $(mstep))"
else fail metrics_connection_flood_survived "$(tail -3 "$T/obs.out")"; fi

# a real Prometheus server scrapes the job; its query API returns the step
s0=$(mstep)
cat >"$T/prometheus.yml" <<EOC
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: dflash
    static_configs:
      - targets: ['127.0.0.1:$MPORT']
EOC
prometheus --config.file="$T/prometheus.yml" --storage.tsdb.path="$T/prom" --web.listen-address="127.0.0.1:$PPORT" \
    >"$T/prometheus.log" 2>&1 &
prom=$!
q() { curl -sf --max-time 5 "http://127.0.0.1:$PPORT/api/v1/query?query=$1"; }
deadline=$((SECONDS + 60))
pstep=
until [ -n "$pstep" ] && [ "$pstep" -ge "$s0" ] 2>/dev/null; do
    [ $SECONDS -lt $deadline ] && kill -0 $prom 2>/dev/null || break
    sleep 0.3
    pstep=$(q dflash_step 2>/dev/null | python3 -c 'import json, sys; r = json.load(sys.stdin)["data"]["result"]; print(r[0]["value"][1] if r else "")' 2>/dev/null)
done
up=$(q up | python3 -c 'import json, sys; r = json.load(sys.stdin)["data"]["result"]; print(r[0]["value"][1] if r else "")' 2>/dev/null)
if [ -n "$pstep" ] && [ "$pstep" -ge "$s0" ] 2>/dev/null && [ "$pstep" -le "$(mstep)" ] && [ "$up" = 1 ]; then
    ok "metrics_prometheus_scrapes (query dflash_step = $pstep, /metrics said $s0 before it started; up = $up)"
else fail metrics_prometheus_scrapes "dflash_step '$pstep' (want >= $s0), up '$up': $(tail -3 "$T/prometheus.log")"; fi
n=$(q 'dflash_worker_restarts_total' | python3 -c 'import json, sys; print(len(json.load(sys.stdin)["data"]["result"]))' 2>/dev/null)
if [ "$n" = 5 ]; then ok "metrics_prometheus_worker_labels (dflash_worker_restarts_total: $n series)"
else fail metrics_prometheus_worker_labels "$n series"; fi
kill $prom 2>/dev/null; wait $prom 2>/dev/null

if out=$(ctl drain 2>&1) && wait $sup; then ok "metrics_job_drains"
else fail metrics_job_drains "$out / $(tail -3 "$T/obs.out")"; fi

# TensorBoard: one event file; framing and CRCs checked by our reader; the scalars equal metrics.jsonl's
ev=("$T"/obs/tensorboard/events.out.tfevents.*)
if [ ${#ev[@]} -eq 1 ] && [ -f "${ev[0]}" ]; then ok "tensorboard_event_file ($(basename "${ev[0]}"), $(stat -c %s "${ev[0]}") bytes)"
else fail tensorboard_event_file "$(ls "$T/obs/tensorboard" 2>&1)"; fi
if "$DUMP" "${ev[0]}" >"$T/events.jsonl" 2>"$T/dump.err"; then ok "tensorboard_framing_and_crcs ($(wc -l <"$T/events.jsonl") records)"
else fail tensorboard_framing_and_crcs "$(cat "$T/dump.err")"; fi
if out=$(python3 - "$T/events.jsonl" "$T/obs/metrics.jsonl" <<'EOP'
import json, math, struct, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
ml = [json.loads(l) for l in open(sys.argv[2])]
errs = []
if not ev or ev[0].get("file_version") != "brain.Event:2": errs.append("first event is not brain.Event:2")
steps = [e for e in ev[1:] if "values" in e]
if [e["step"] for e in steps] != [m["step"] for m in ml]: errs.append("steps differ: %d events, %d lines" % (len(steps), len(ml)))
f32 = lambda x: struct.unpack("f", struct.pack("f", x))[0]
def same(tb, js, digits):
    if js is None: return tb in ("NaN", "inf", "-inf")
    return abs(tb - f32(js)) <= 0.5 * 10 ** -digits + 1e-6 * abs(js)
n = 0
for e, m in zip(steps, ml):
    v = e["values"]
    want = [("loss", m["loss"], 6), ("acceptance", m["acceptance"], 6), ("grad_norm", m["grad_norm"], 6),
            ("lr", m["lr"], 12), ("tokens", m["tokens"], 0)]
    want += [("slot_accuracy/%d" % (i + 1), a, 4) for i, a in enumerate(m["slot_accuracy"])]
    if sorted(v) != sorted(t for t, _, _ in want): errs.append("step %d: tags %s" % (m["step"], sorted(v)))
    for tag, js, digits in want:
        n += 1
        if tag == "lr": ok = js == 0 and v[tag] == 0 or abs(v[tag] - js) <= 1e-5 * abs(js) # metrics.jsonl: %.6g
        else: ok = tag in v and same(v[tag], js, digits)
        if not ok and len(errs) < 5: errs.append("step %d %s: tensorboard %s, metrics.jsonl %s" % (m["step"], tag, v.get(tag), js))
print("; ".join(errs) if errs else "%d steps, %d scalars equal metrics.jsonl" % (len(ml), n))
sys.exit(1 if errs else 0)
EOP
); then ok "tensorboard_scalars_equal_metrics_jsonl ($out)"; else fail tensorboard_scalars_equal_metrics_jsonl "$out"; fi
# TensorBoard's own reader, where the tensorboard Python package is installed (the GPU machine has it)
if python3 -c 'import tensorboard' 2>/dev/null; then
    python3 tests/gpu/tensorboard_check.py "$T/obs" || FAILED=1
else
    echo "note: the tensorboard Python package is not installed here: TensorBoard's EventAccumulator check" \
         "(tests/gpu/tensorboard_check.py) not run"
fi
exit $FAILED
