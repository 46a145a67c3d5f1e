#!/usr/bin/env python3
"""poison.py SRC DST TENSOR [INDEX]: a copy of checkpoint folder SRC in DST with one NaN at flat element INDEX
(default 0) of TENSOR in its model.safetensors (F32, BF16 or F16), everything else byte for byte the same."""
import json, shutil, struct, sys

src, dst, name = sys.argv[1:4]
index = int(sys.argv[4]) if len(sys.argv) > 4 else 0
shutil.copytree(src, dst)
path = dst + "/model.safetensors"
raw = bytearray(open(path, "rb").read())
n = struct.unpack("<Q", raw[:8])[0]
hdr = json.loads(raw[8:8 + n])
if name not in hdr:
    sys.exit("poison.py: %s has no tensor %s (it has %s)" % (path, name, ", ".join(k for k in hdr if k != "__metadata__")))
t = hdr[name]
start = 8 + n + t["data_offsets"][0]
nan = {"F32": struct.pack("<f", float("nan")), "BF16": b"\xc0\x7f", "F16": b"\x00\x7e"}[t["dtype"]]
at = start + index * len(nan)
assert at + len(nan) <= 8 + n + t["data_offsets"][1], "index outside the tensor"
raw[at:at + len(nan)] = nan
open(path, "wb").write(raw)
