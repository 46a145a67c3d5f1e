#!/usr/bin/env bash
# dflash plot on a real run folder (a short CPU job) and an eval.jsonl beside it: the PNG decodes (signature, chunk
# CRCs, 1000x1000 RGB, every row unfiltered) and shows the loss, simulated-tau and decoded-tau colours; the SVG is
# XML with one stroked polyline across the plot per series (loss, each slot's accuracy, simulated tau, decoded tau)
# and a dot per evaluated step. Bad input: a metrics line of the wrong type, a line that is not JSON, an eval line
# without tau, a missing run folder: exit 1 naming the file and line; a last line still being written is left out;
# usage errors exit 2.
cd "$(dirname "$0")/../.." || exit 1
. tests/system/lib.bash
PLOT=("$BIN/dflash" plot)
make_fixture || { fail plot_fixture "$(tail -3 "$T/fixture.log")"; exit 1; }
write_config job 30
run_job job || { fail plot_job "$(tail -3 "$T/job.out")"; exit 1; }
R=$T/job
printf '{"step": 0, "tau": 1.02, "prompts": 4}\n{"step": 10, "tau": 1.4}\n{"step": 20, "tau": 1.9}\n{"step": 29, "tau": 2.2}\n' \
    >"$R/eval.jsonl"
# dflashd copies each evaluation into metrics.jsonl as {"step", "decoded_tau", ...}: not a training step
printf '{"step": 10, "decoded_tau": 1.4, "decoded_prompts": 4, "eval_seconds": 0.5}\n' >>"$R/metrics.jsonl"

"${PLOT[@]}" "$R" -o "$T/p.png" >"$T/png.out" 2>&1 && "${PLOT[@]}" "$R" -o "$T/p.svg" >"$T/svg.out" 2>&1 ||
    { fail plot_writes "$(cat "$T/png.out" "$T/svg.out")"; exit 1; }
grep -q "30 steps, 3 slots, 4 decoded" "$T/png.out" && ok plot_says_what_it_drew || fail plot_says_what_it_drew \
    "$(cat "$T/png.out")"

# PNG: decode it with zlib (no imaging library needed): chunks and CRCs, IHDR, IDAT inflated and unfiltered; then
# count the pixels near each series' colour
out=$(python3 - "$T/p.png" <<'EOP'
import struct, sys, zlib
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", "no PNG signature"
pos, chunks = 8, []
while pos < len(data):
    n, kind = struct.unpack(">I4s", data[pos:pos + 8])
    body, crc = data[pos + 8:pos + 8 + n], struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])[0]
    assert zlib.crc32(kind + body) & 0xffffffff == crc, "bad CRC in chunk %r" % kind
    chunks.append((kind, body))
    pos += 12 + n
assert chunks[0][0] == b"IHDR" and chunks[-1][0] == b"IEND", "chunk order"
w, h, depth, ctype = struct.unpack(">IIBB", chunks[0][1][:10])
assert (w, h, depth) == (1000, 1000, 8) and ctype in (2, 6), "IHDR %dx%d depth %d type %d" % (w, h, depth, ctype)
bpp = 3 if ctype == 2 else 4
raw = zlib.decompress(b"".join(b for k, b in chunks if k == b"IDAT"))
assert len(raw) == h * (1 + w * bpp), "IDAT inflates to %d bytes" % len(raw)
stride, prev, rows = w * bpp, bytearray(w * bpp), []
for y in range(h):
    f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
    for i in range(stride):
        a = line[i - bpp] if i >= bpp else 0
        b, c = prev[i], prev[i - bpp] if i >= bpp else 0
        if f == 1: line[i] = (line[i] + a) & 255
        elif f == 2: line[i] = (line[i] + b) & 255
        elif f == 3: line[i] = (line[i] + (a + b) // 2) & 255
        elif f == 4:
            p = a + b - c; pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        else: assert f == 0, "filter %d on row %d" % (f, y)
    rows.append(line); prev = line
colours = {"loss": (31, 119, 180), "simulated": (44, 160, 44), "decoded": (214, 39, 40)}
counts = {k: 0 for k in colours}
for line in rows:
    for x in range(0, stride, bpp):
        px = line[x:x + 3]
        for k, c in colours.items():
            if abs(px[0] - c[0]) + abs(px[1] - c[1]) + abs(px[2] - c[2]) < 24: counts[k] += 1
few = [k for k, n in counts.items() if n < 40]
print("%dx%d; pixels per series %s" % (w, h, counts))
sys.exit(1 if few else 0)
EOP
) && ok plot_png_decodes_with_series || fail plot_png_decodes_with_series "$out"

# SVG: Cairo draws each series as one stroked path in its colour (text is glyph outlines); the polylines of the
# series span the step axis (x from the plot's left edge to its right edge); decoded tau has a dot per eval line
out=$(python3 - "$T/p.svg" <<'EOP'
import re, sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
assert root.tag.endswith("svg"), "root is %s" % root.tag
named = {"rgb(12.2%,46.7%,70.6%)": "loss", "rgb(17.3%,62.7%,17.3%)": "simulated", "rgb(83.9%,15.3%,15.7%)": "decoded"}
grey = {"rgb(20%,20%,20%)", "rgb(88%,88%,88%)", "rgb(15%,15%,15%)"}
lines, dots, errs = {}, {}, []
for el in root.iter():
    if not el.tag.endswith("path"): continue
    st, d = el.get("style", ""), el.get("d", "")
    xs = [float(x) for x in re.findall(r"[ML] (-?[\d.]+) ", d)]
    m = re.search(r"stroke:(rgb\([^)]*\))", st)
    if m and m.group(1) not in grey and len(xs) >= 3:
        lines.setdefault(m.group(1), []).append((min(xs), max(xs)))
    m = re.search(r"fill:(rgb\([^)]*\))", st)
    if m and m.group(1) in named and "stroke:rgb" not in st:
        dots[named[m.group(1)]] = d.count("M")
for colour, name in named.items():
    if colour not in lines: errs.append("no %s polyline" % name)
slots = [c for c in lines if c not in named]
if len(slots) != 3: errs.append("%d slot polylines, want 3 (block size 4)" % len(slots))
for c, spans in lines.items():
    lo, hi = spans[0]
    if len(spans) != 1 or (named.get(c) != "decoded" and (abs(lo - 80) > 1 or abs(hi - 830) > 1)):
        errs.append("%s: polylines %s, want one from x 80 to 830" % (named.get(c, c), spans))
if dots.get("decoded") != 4: errs.append("decoded tau: %s dots, want 4" % dots.get("decoded"))
print("; ".join(errs) if errs else "series: %s + %d slots; %d decoded dots" % (sorted(named.values()), len(slots), dots["decoded"]))
sys.exit(1 if errs else 0)
EOP
) && ok plot_svg_series || fail plot_svg_series "$out"

# bad input: each names the file and the line
expect_bad() { # name, run folder, text the message must hold
    local out rc
    out=$("${PLOT[@]}" "$2" -o "$T/bad.png" 2>&1); rc=$?
    if [ "$rc" -eq 1 ] && [[ "$out" == *"$3"* ]]; then ok "$1"; else fail "$1" "exit $rc: $out (want '$3')"; fi
}
mkdir -p "$T/b1" "$T/b2" "$T/b3" "$T/b4"
sed '3s/"loss": [^,]*/"loss": "low"/' "$R/metrics.jsonl" >"$T/b1/metrics.jsonl"
expect_bad plot_bad_metrics_type "$T/b1" "$T/b1/metrics.jsonl:3: \"loss\" is string, want a number"
sed '5s/.*/{"step": 4, "loss": 1.0,/' "$R/metrics.jsonl" >"$T/b2/metrics.jsonl"
expect_bad plot_bad_metrics_json "$T/b2" "$T/b2/metrics.jsonl:5:"
cp "$R/metrics.jsonl" "$T/b3/"
printf '{"step": 0, "tau": 1.1}\n{"step": 10}\n' >"$T/b3/eval.jsonl"
expect_bad plot_bad_eval_line "$T/b3" "$T/b3/eval.jsonl:2: no finite \"tau\""
expect_bad plot_missing_run "$T/nowhere" "$T/nowhere/metrics.jsonl"
# a last line without its newline (still being written) is left out
cp "$R/metrics.jsonl" "$T/b4/"
printf '{"step": 30, "loss": 0.' >>"$T/b4/metrics.jsonl"
out=$("${PLOT[@]}" "$T/b4" 2>&1)
[ $? -eq 0 ] && [ -s "$T/b4/plot.png" ] && [[ "$out" == *"30 steps"* ]] && ok plot_torn_last_line_left_out ||
    fail plot_torn_last_line_left_out "$out"

out=$("${PLOT[@]}" "$R" -o "$T/p.jpg" 2>&1); rc=$?
[ $rc = 2 ] && [[ "$out" == *".png or .svg"* ]] && ok plot_usage_error || fail plot_usage_error "exit $rc: $out"
out=$("${PLOT[@]}" --help 2>&1); rc=$?
[ $rc = 0 ] && [[ "$out" == *"eval.jsonl"* && "$out" == *"-o"* ]] && ok plot_help || fail plot_help "exit $rc: $out"
exit $FAILED
