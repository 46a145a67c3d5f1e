# TIMEOUT=150
# dflash attention backward, the dk/dv CTAs' pipelined step loop (engineer dkv2; DFLASH_ATTENTION_DKV_PIPE=1, not the
# default until this has run): every dflash_attention row of the kernel case table with the pipelined loop (each row
# against the CPU, twice bitwise; the timed Qwen3-8B rows time it), the drafter bench with it and with the default
# serial loop, the head_dim 128 rows (the wgmma path, timed rows included) with the serial loop, then the timed 8B rows
# and the bench once more each way (noise). Only GPU work: run after `make -j2 all`.
set -u
rows() { grep -E "FAIL|^timing|^test_kernel_cases_gpu:" "$1" | cut -c1-300; echo "ok lines: $(grep -c '^ok' "$1")"; }
bench() { timeout 15 build/bench/bench_drafter --iters 5 2>&1 | grep "forward_backward\|time split"; }
echo "== test_kernel_cases_gpu dflash_attention with DFLASH_ATTENTION_DKV_PIPE=1 (pipelined dk/dv)"
DFLASH_ATTENTION_DKV_PIPE=1 timeout 55 build/gpu/test_kernel_cases_gpu dflash_attention > /tmp/kc1.log 2>&1
echo "rc=$?"; rows /tmp/kc1.log
echo "== bench_drafter DFLASH_ATTENTION_DKV_PIPE=1"
DFLASH_ATTENTION_DKV_PIPE=1 bench
echo "== bench_drafter (serial dk/dv, the default)"
bench
echo "== test_kernel_cases_gpu 'hd=128 B=' (serial dk/dv, the default)"
timeout 25 build/gpu/test_kernel_cases_gpu "hd=128 B=" > /tmp/kc0.log 2>&1
echo "rc=$?"; rows /tmp/kc0.log
echo "== the timed 8B rows again with DFLASH_ATTENTION_DKV_PIPE=1"
DFLASH_ATTENTION_DKV_PIPE=1 timeout 12 build/gpu/test_kernel_cases_gpu "nh=32 nkv=8 hd=128 B=16" 2>&1 | grep "^timing\|FAIL\|rows"
echo "== bench_drafter DFLASH_ATTENTION_DKV_PIPE=1 again"
DFLASH_ATTENTION_DKV_PIPE=1 bench
echo "== bench_drafter (serial) again"
bench
exit 0
