# The end-to-end job (sourced by bench/e2e.sh and bench/restart_gap.sh): the target at WORK/target and the prepared
# data at WORK/data (2800-3072-token samples, ${SEQS:-1} per batch: max_batch_tokens is SEQS x 3072, so SEQS of them
# always fit and the packer puts exactly SEQS in each), the drafter the job derives from the target (5 layers, its
# hidden size, block 16, 512 anchors, the spec's 5 default taps), one target and one drafter, no checkpoint but the
# last.
# e2e_job_config FILE NAME RUN_DIR WORK: that job, named NAME, of $STEPS steps on ${BACKEND:-cuda}, written to FILE.
e2e_job_config() {
    cat >"$1" <<EOC
[job]
name = $2
run_dir = $3
seed = 1
backend = ${BACKEND:-cuda}
[data]
path = $4/data
max_batch_tokens = $((3072 * ${SEQS:-1}))
max_batch_seqs = ${SEQS:-1}
[target]
model = $4/target
[drafter]
layers = 5
block_size = 16
num_taps = 5
max_anchors = 512
[train]
steps = $STEPS
warmup_steps = 10
checkpoint_every = 0
[workers]
targets = 1
drafters = 1
watchdog_sec = 300
heartbeat_timeout_sec = 300
[ring]
token_slots = 4
pool_slots = 3
EOC
}
