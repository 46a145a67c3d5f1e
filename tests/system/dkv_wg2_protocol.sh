#!/usr/bin/env bash
# The barrier protocol of the wg2 dk/dv CTAs' schedules (kernels/dflash_attention.cu, wg2_sched) and of the forward's
# fwd_ws_sm90_kernel (with and without turns), checked on a model before a GPU runs them (tests/models/dkv_wg2_protocol.py): a ring of 3 or 4
# stages, with and without the pipelined consumers and the turns, 3,000 random walks and interleavings each; a walk
# that cannot finish is a deadlock.
cd "$(dirname "$0")/../.." || exit 1
python3 tests/models/dkv_wg2_protocol.py | sed -e 's/^\(.*: 0 of .*\)$/ok \1/' -e '/^ok /!s/^/FAIL /'
exit "${PIPESTATUS[0]}"
