#!/usr/bin/env python3
"""tensorboard_check.py RUN_DIR: read the TensorBoard event file(s) a job wrote with metrics.tensorboard = true
(RUN_DIR/tensorboard/events.out.tfevents.*) with TensorBoard's own EventAccumulator, and check that every scalar of
every step equals RUN_DIR/metrics.jsonl (float32 against the JSON's printed digits; a null loss or norm, a step
the NaN guard skipped, against NaN/inf). Prints "ok tensorboard_eventaccumulator (...)" or "FAIL ..."; exit 0/1.
Needs the tensorboard Python package (the GPU machine has it); tests/system/metrics.sh runs it when it can import
tensorboard, else says so."""
import json
import math
import os
import struct
import sys


def main():
    if len(sys.argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    run_dir = sys.argv[1]
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError as e:
        print("FAIL tensorboard_eventaccumulator: cannot import tensorboard (%s)" % e)
        return 1
    tb_dir = os.path.join(run_dir, "tensorboard")
    acc = EventAccumulator(tb_dir, size_guidance={"scalars": 0})  # 0: keep every event, no reservoir sampling
    acc.Reload()
    lines = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
    tags = set(acc.Tags()["scalars"])
    f32 = lambda x: struct.unpack("f", struct.pack("f", x))[0]
    errs, n = [], 0
    if not lines:
        errs.append("metrics.jsonl is empty")
    want_tags = {"loss", "acceptance", "grad_norm", "lr", "tokens"}
    want_tags |= {"slot_accuracy/%d" % (i + 1) for i in range(len(lines[0]["slot_accuracy"]) if lines else 0)}
    if tags != want_tags:
        errs.append("tags %s, expected %s" % (sorted(tags), sorted(want_tags)))
    series = {t: acc.Scalars(t) for t in tags & want_tags}
    for tag, ev in series.items():
        # a resumed job appends the redone steps again, in metrics.jsonl and in a new event file alike
        if len(ev) != len(lines):
            errs.append("%s: %d events, metrics.jsonl has %d lines" % (tag, len(ev), len(lines)))
            continue
        for e, m in zip(ev, lines):
            if e.step != m["step"]:
                errs.append("%s: event step %d where metrics.jsonl has step %d" % (tag, e.step, m["step"]))
                break
            if tag.startswith("slot_accuracy/"):
                js, digits = m["slot_accuracy"][int(tag.split("/")[1]) - 1], 4
            else:
                js, digits = m[tag], {"tokens": 0, "lr": None}.get(tag, 6)
            v = e.value
            n += 1
            if js is None:
                good = math.isnan(v) or math.isinf(v)
            elif digits is None:  # lr: printed with %.6g
                good = abs(v - js) <= 1e-5 * abs(js) + 1e-12
            else:
                good = abs(v - f32(js)) <= 0.5 * 10 ** -digits + 1e-6 * abs(js)
            if not good and len(errs) < 8:
                errs.append("step %d %s: TensorBoard %r, metrics.jsonl %r" % (m["step"], tag, v, js))
    if errs:
        print("FAIL tensorboard_eventaccumulator: " + "; ".join(errs))
        return 1
    import tensorboard
    print("ok tensorboard_eventaccumulator (tensorboard %s: %d steps x %d tags = %d scalars equal metrics.jsonl)" %
          (tensorboard.__version__, len(lines), len(series), n))
    return 0


if __name__ == "__main__":
    sys.exit(main())
