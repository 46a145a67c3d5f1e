#!/usr/bin/env bash
# Checkpoint retention (issue 24, part 3): train.keep_checkpoints = 2 and keep_every = 20 on a run_dir that is a
# small tmpfs, too small for every checkpoint of the run. The job never holds for space, finishes with every step
# in the ledger once and the same final weights as the same run with every checkpoint kept on an ordinary disk;
# what is left is the newest two, every 20th step and latest; the console says once how much disk they take.
# Needs root for the tmpfs mount (the CI machine's tests run as root); elsewhere it says why it cannot run.
cd "$(dirname "$0")/../.." || exit 1
. tests/system/lib.bash
STEPS=60
EVERY=2
if [ "$(id -u)" != 0 ]; then echo "retention.sh: mounting a tmpfs needs root"; exit 77; fi
mkdir -p "$T/disk"
mount -t tmpfs -o size=2m tmpfs "$T/disk" || { echo "retention.sh: cannot mount a tmpfs at $T/disk"; exit 77; }
trap 'umount -l "$T/disk" 2>/dev/null; cleanup' EXIT
make_fixture || { fail retention_fixture "$(tail -3 "$T/fixture.log")"; exit 1; }

write_config all $STEPS
sed -i "s/^checkpoint_every = 10$/checkpoint_every = $EVERY/" "$T/all.ini"
run_job all || { fail retention_reference_run "$(tail -5 "$T/all.out")"; exit 1; }

write_config kept $STEPS "[train]
keep_checkpoints = 2
keep_every = 20"
sed -i -e "s/^checkpoint_every = 10$/checkpoint_every = $EVERY/" -e "s|^run_dir = .*|run_dir = $T/disk/kept|" "$T/kept.ini"
one=$(du -sk "$T/all/ckpt/step-00000002" | cut -f1)
all=$(du -sk "$T/all/ckpt" | cut -f1)
disk=$(df -k --output=size "$T/disk" | tail -1 | tr -d ' ')
if [ "$all" -gt "$disk" ]; then ok "retention_disk_too_small_for_all ($((STEPS / EVERY)) checkpoints of ${one} KiB = $all KiB > $disk KiB)"
else fail retention_disk_too_small_for_all "every checkpoint ($all KiB) fits the $disk KiB tmpfs: the test proves nothing"; fi

if run_job kept; then ok retention_run_completes; else fail retention_run_completes "$(tail -5 "$T/kept.out")"; fi
held=$(grep -h "holds at step\|HOLDING\|No space left" "$T/disk/kept/logs/"*.log "$T/kept.out" 2>/dev/null | head -3)
if [ -z "$held" ]; then ok retention_never_held_for_space; else fail retention_never_held_for_space "$held"; fi
left=$(cd "$T/disk/kept/ckpt" && ls -d step-* | tr '\n' ' ')
latest=$(readlink "$T/disk/kept/ckpt/latest")
if [ "$left" = "step-00000020 step-00000040 step-00000058 step-00000060 " ] && [ "$latest" = step-00000060 ]; then
    ok "retention_keeps_newest_two_every_20th_and_latest ($left-> $latest)"
else
    fail retention_keeps_newest_two_every_20th_and_latest "left: $left latest: $latest"
fi
if msg=$(check_ledger disk/kept $STEPS 2); then ok "retention_ledger_exactly_once ($msg)"
else fail retention_ledger_exactly_once "$msg"; fi
if cmp -s "$(final_weights all)" "$T/disk/kept/ckpt/latest/optimizer.safetensors"; then ok retention_same_final_weights
else fail retention_same_final_weights "the run with retention ends with other weights than the one keeping all"; fi
said=$(grep -c "^dflash: checkpoints: " "$T/kept.out")
line=$(grep "^dflash: checkpoints: " "$T/kept.out")
if [ "$said" = 1 ] && echo "$line" | grep -q "4 in .* take 0\.[0-9] MiB (train.keep_checkpoints = 2, keep_every = 20"; then
    ok "retention_console_says_disk_once ($line)"
else
    fail retention_console_says_disk_once "$said lines: $line"
fi
grep -q "^dflash: checkpoints: 30 in .*all kept" "$T/all.out" && ok retention_all_kept_said ||
    fail retention_all_kept_said "$(grep 'checkpoints:' "$T/all.out")"
exit $FAILED
