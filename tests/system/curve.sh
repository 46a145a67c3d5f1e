#!/usr/bin/env bash
# The control plane over tcp:// with CURVE (issue 5): `dflashctl keygen` writes dflashd's key pair (secret 0600,
# public 0644, never replacing a key); a tcp endpoint without a secret key is refused at start with the field named;
# a whole job runs with every worker on tcp (each derives dflashd's public key from the secret it may read);
# dflashctl reaches it with the public key alone (--server-key, or a config naming only the public key file); a
# client with the wrong server key, without a key, or speaking plaintext gets no answer while dflashd keeps
# serving; drain over tcp ends the job with every batch in the ledger exactly once. With an allow-list of client
# keys (control.curve_client_keys_file), only a listed client key gets an answer (the workers, which use dflashd's
# own pair, keep training), also after a SIGKILL of dflashd; a read-only key (control.curve_readonly_keys_file)
# gets status and config, and every steering command refused; a bad allow-list is refused at start with file:line.
cd "$(dirname "$0")/../.." || exit 1
. tests/system/lib.bash
CTL="$BIN/dflashctl"
PROBE=${BUILD:-build}/tests/system/ctl_probe
make_fixture || { fail curve_fixture "$(tail -3 "$T/fixture.log")"; exit 1; }

# keygen: two files, the secret private, 40 Z85 characters each; a second keygen into the same folder is refused
mkdir -p "$T/keys" "$T/other"
if out=$("$CTL" keygen "$T/keys" 2>&1) && [ "$(stat -c %a "$T/keys/dflashd.key")" = 600 ] &&
   [ "$(stat -c %a "$T/keys/dflashd.pub")" = 644 ] && [ "$(head -c 40 "$T/keys/dflashd.key" | tr -d '\n' | wc -c)" = 40 ] &&
   [ "$(wc -c <"$T/keys/dflashd.pub")" = 41 ] && ! cmp -s "$T/keys/dflashd.key" "$T/keys/dflashd.pub"; then
    ok "curve_keygen_writes_key_pair"
else
    fail curve_keygen_writes_key_pair "$out; $(ls -l "$T/keys" 2>&1)"
fi
# the config snippet keygen prints parses as it is (dflash run reads the config before anything else)
sed -n '/^\[control\]/,/^clients elsewhere/p' <<<"$out" | grep -v "^clients" | sed "s/HOST:PORT/127.0.0.1:9/" >"$T/snippet.ini"
printf '[job]\nrun_dir = %s/snippet\n[data]\npath = x\n[target]\nmodel = x\n' "$T" >>"$T/snippet.ini"
sout=$("$BIN/dflash" run -c "$T/snippet.ini" --bin-dir "$T/nowhere" 2>&1)
if grep -q "^curve_secret_key_file = " "$T/snippet.ini" && echo "$sout" | grep -q "cannot execute"; then ok curve_keygen_snippet_parses
else fail curve_keygen_snippet_parses "$sout"; fi
sum=$(md5sum "$T/keys/dflashd.key" "$T/keys/dflashd.pub")
out=$("$CTL" keygen "$T/keys" 2>&1); rc=$?
if [ $rc = 1 ] && [[ "$out" == *"dflashd.key: File exists"* ]] && [ "$(md5sum "$T/keys/dflashd.key" "$T/keys/dflashd.pub")" = "$sum" ] &&
   [ "$(ls -A "$T/keys" | wc -l)" = 2 ]; then
    ok "curve_keygen_never_replaces_a_key"
else
    fail curve_keygen_never_replaces_a_key "exit $rc: $out"
fi
"$CTL" keygen "$T/other" >/dev/null || fail curve_keygen_other "second key pair"

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
EP=tcp://127.0.0.1:$port

# tcp without a secret key: dflashd refuses to start, naming the field; dflash run ends at once
write_config nokey 100 "[control]
endpoint = $EP"
if run_job nokey; then fail curve_tcp_needs_secret_key "dflash run exit 0"
elif grep -q "control.endpoint $EP: only ipc:// without control.curve_secret_key_file" "$T/nokey.out"; then
    ok curve_tcp_needs_secret_key
else
    fail curve_tcp_needs_secret_key "$(tail -2 "$T/nokey.out")"
fi

# the job on tcp + CURVE: dflashd and every worker
write_config tcp 1000000 "[control]
endpoint = $EP
curve_secret_key_file = $T/keys/dflashd.key"
sed -i 's/^checkpoint_every = .*/checkpoint_every = 0/' "$T/tcp.ini"
# a client that only has the public key: its own config names the public key file
sed -e "s|^curve_secret_key_file = .*|curve_public_key_file = $T/keys/dflashd.pub|" "$T/tcp.ini" >"$T/client.ini"
ctl() { "$CTL" --endpoint "$EP" --server-key "$T/keys/dflashd.pub" --wait 120 "$@"; }
step() { ctl status 2>/dev/null | awk 'NR == 2 { split($2, a, "/"); print a[1] }'; }
running() { ctl status --json 2>/dev/null | python3 -c "import json, sys; print(sum(w['state'] == 'running' for w in json.load(sys.stdin)['workers']))" 2>/dev/null; }
"$BIN/dflash" run -c "$T/tcp.ini" >"$T/tcp.out" 2>&1 &
sup=$!
deadline=$((SECONDS + 60))
until [ "$(running)" = 5 ] && [ "$(step)" -gt 3 ] 2>/dev/null; do
    [ $SECONDS -lt $deadline ] && kill -0 $sup 2>/dev/null || break
    sleep 0.2
done
if [ "$(running)" = 5 ] && [ "$(step)" -gt 3 ] 2>/dev/null && grep -q "control: serving on $EP" "$T/tcp/logs/dflashd.log"; then
    ok "curve_job_trains_over_tcp (step $(step), 5 workers running)"
else
    fail curve_job_trains_over_tcp "$(tail -3 "$T/tcp.out"; tail -3 "$T/tcp/logs/dflashd.log")"
    kill $sup 2>/dev/null; wait $sup 2>/dev/null
    exit 1
fi
if out=$("$CTL" -c "$T/client.ini" status 2>&1) && [[ "$out" == *"drafter-1"* ]]; then
    ok curve_client_config_with_public_key_only
else
    fail curve_client_config_with_public_key_only "$out"
fi

# clients that must get nothing: the wrong server key, no key, plaintext; dflashd keeps serving each time
"$CTL" --endpoint "$EP" --server-key "$T/other/dflashd.pub" --timeout 2 status >"$T/wrong.out" 2>&1; a=$?
"$CTL" --endpoint "$EP" --timeout 2 status >"$T/nokey-client.out" 2>&1; b=$?
c=$("$PROBE" "$EP" status 2>&1)
if [ $a = 2 ] && grep -q "no answer within" "$T/wrong.out" && [ $b = 2 ] &&
   grep -q "a tcp endpoint needs --server-key" "$T/nokey-client.out" && [ "$c" = "no reply" ] && ctl status >/dev/null 2>&1; then
    ok "curve_unauthenticated_clients_get_nothing (wrong key: exit $a, no key: exit $b, plaintext: $c)"
else
    fail curve_unauthenticated_clients_get_nothing "wrong key exit $a ($(cat "$T/wrong.out")); no key exit $b ($(cat "$T/nokey-client.out")); plaintext: $c"
fi

# drain over tcp: a checkpoint, a clean exit, the ledger exact
if out=$(ctl drain 2>&1); then
    wait $sup
    rc=$?
    stop=$(echo "$out" | sed -n 's/^drained: \([0-9]*\) steps.*/\1/p')
    if [ $rc = 0 ] && [ -n "$stop" ] && [ -e "$T/tcp/ckpt/latest" ]; then ok "curve_drain_over_tcp (${out//$'\n'/; })"
    else fail curve_drain_over_tcp "dflash run exit $rc; $out"; fi
    if msg=$(check_ledger tcp "$stop" 2); then ok "curve_ledger_exactly_once ($msg)"; else fail curve_ledger_exactly_once "$msg"; fi
else
    fail curve_drain_over_tcp "$out"
    kill $sup 2>/dev/null; wait $sup 2>/dev/null
fi
# an allow-list of client keys: alice is listed, bob is not
"$CTL" keygen --name alice "$T/keys" >/dev/null && "$CTL" keygen --name bob "$T/keys" >/dev/null &&
    "$CTL" keygen --name carol "$T/keys" >/dev/null || fail curve_keygen_client_keys "keygen --name"
printf '# who may steer the job\n\n%s\n' "$(cat "$T/keys/alice.pub")" >"$T/allowed.keys"
printf '# dashboards: status and config only\n%s\n' "$(cat "$T/keys/carol.pub")" >"$T/readonly.keys"
port2=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
EP2=tcp://127.0.0.1:$port2
write_config acl 1000000 "[control]
endpoint = $EP2
curve_secret_key_file = $T/keys/dflashd.key
curve_client_keys_file = $T/allowed.keys
curve_readonly_keys_file = $T/readonly.keys"
sed -i 's/^checkpoint_every = .*/checkpoint_every = 0/' "$T/acl.ini"
actl() { "$CTL" --endpoint "$EP2" --server-key "$T/keys/dflashd.pub" --timeout 2 "$@"; }
astep() { actl --client-key "$T/keys/alice.key" status 2>/dev/null | awk 'NR == 2 { split($2, a, "/"); print a[1] }'; }
"$BIN/dflash" run -c "$T/acl.ini" >"$T/acl.out" 2>&1 &
sup=$!
deadline=$((SECONDS + 60))
until [ "$(astep)" -gt 3 ] 2>/dev/null; do
    [ $SECONDS -lt $deadline ] && kill -0 $sup 2>/dev/null || break
    sleep 0.2
done
if [ "$(astep)" -gt 3 ] 2>/dev/null && grep -qF "CURVE clients limited to 1 key(s) of $T/allowed.keys, 1 read-only key(s) of $T/readonly.keys, and dflashd's own" "$T/acl/logs/dflashd.log"; then
    ok "curve_allow_list_listed_client_and_workers (step $(astep))"
else
    fail curve_allow_list_listed_client_and_workers "$(tail -3 "$T/acl.out"; tail -3 "$T/acl/logs/dflashd.log")"
fi
actl --client-key "$T/keys/bob.key" status >"$T/bob.out" 2>&1; a=$?
actl status >"$T/anon.out" 2>&1; b=$?
s1=$(astep); sleep 1; s2=$(astep)
if [ $a = 2 ] && [ $b = 2 ] && grep -q "no answer within" "$T/bob.out" &&
   grep -qF "control: refused a CURVE client from 127.0.0.1: key $(cat "$T/keys/bob.pub") is not in $T/allowed.keys or $T/readonly.keys" "$T/acl/logs/dflashd.log" &&
   [ "$s2" -gt "$s1" ] 2>/dev/null; then
    ok "curve_allow_list_refuses_unlisted_clients (bob: exit $a, ephemeral key: exit $b, training continues $s1 -> $s2)"
else
    fail curve_allow_list_refuses_unlisted_clients "bob exit $a ($(cat "$T/bob.out")), anonymous exit $b, steps $s1 -> $s2; $(grep refused "$T/acl/logs/dflashd.log" | head -2)"
fi
# a read-only key (carol): status and config answer, every command that steers is refused (exit 1), training goes on
cctl() { actl --client-key "$T/keys/carol.key" "$@"; }
ro_ok=1 ro_msg=""
cctl status >/dev/null 2>&1 || { ro_ok=0; ro_msg+="status failed; "; }
cctl config | grep -q "^curve_readonly_keys_file = " || { ro_ok=0; ro_msg+="config failed; "; }
for cmd in pause resume drain "restart target-0" "rolling-restart drafter"; do
    out=$(cctl --wait 10 $cmd 2>&1); rc=$?
    [ $rc = 1 ] && [[ "$out" == *"refused: this client's key is read-only (control.curve_readonly_keys_file): status and config only"* ]] ||
        { ro_ok=0; ro_msg+="$cmd: exit $rc $out; "; }
done
held=$(actl --client-key "$T/keys/alice.key" status --json | python3 -c "import json, sys; d = json.load(sys.stdin); print(d['held'], d.get('stop_step', 0), [w['restarts'] for w in d['workers']])")
s1=$(astep); sleep 1; s2=$(astep)
if [ $ro_ok = 1 ] && [ "$held" = "False 0 [0, 0, 0, 0, 0]" ] && [ "$s2" -gt "$s1" ] 2>/dev/null; then
    ok "curve_readonly_key_status_only (status and config answered; pause, resume, drain, restart, rolling-restart refused; step $s1 -> $s2)"
else
    fail curve_readonly_key_status_only "$ro_msg held/stop/restarts: $held; steps $s1 -> $s2"
fi

# dflashd SIGKILLed under the allow-list: the restarted one loads the list again, the workers reconnect with
# dflashd's pair and training goes on, alice is still admitted and bob still refused
afield() { actl --client-key "$T/keys/alice.key" status --json 2>/dev/null | python3 -c "import json, sys; d = json.load(sys.stdin); print($1)" 2>/dev/null; }
keeper=$(afield "d['keeper_pid']")
s1=$(astep)
kill -9 "$keeper"
deadline=$((SECONDS + 60))
until [ "$(afield "d['keeper_pid']")" -gt 0 ] 2>/dev/null && [ "$(afield "d['keeper_pid']")" != "$keeper" ] &&
      [ "$(astep)" -gt "$((${s1:-0} + 20))" ] 2>/dev/null || [ $SECONDS -ge $deadline ]; do sleep 0.3; done
s2=$(astep)
actl --client-key "$T/keys/bob.key" status >/dev/null 2>&1; a=$?
if [ "$(afield "d['keeper_pid']")" != "$keeper" ] && [ "$s2" -gt "$((${s1:-0} + 20))" ] 2>/dev/null && [ $a = 2 ] &&
   [ "$(grep -c "CURVE clients limited to 1 key(s)" "$T/acl/logs/dflashd.log")" -ge 2 ]; then
    ok "curve_allow_list_survives_dflashd_restart (dflashd pid $keeper -> $(afield "d['keeper_pid']"), step ${s1:-?} -> $s2, bob: exit $a)"
else
    fail curve_allow_list_survives_dflashd_restart "dflashd $keeper -> $(afield "d['keeper_pid']"), steps ${s1:-?} -> $s2, bob exit $a; $(tail -3 "$T/acl/logs/dflashd.log")"
fi
if out=$(actl --client-key "$T/keys/alice.key" --wait 120 drain 2>&1); then
    wait $sup; rc=$?
    [ $rc = 0 ] && ok curve_allow_list_drain || fail curve_allow_list_drain "dflash run exit $rc"
else
    fail curve_allow_list_drain "$out"
    kill $sup 2>/dev/null; wait $sup 2>/dev/null
fi

# a key list with an ipc endpoint would guard nothing: refused at start, naming the field
write_config aclipc 100 "[control]
curve_readonly_keys_file = $T/readonly.keys"
if run_job aclipc; then fail curve_key_list_needs_tcp "dflash run exit 0"
elif grep -qF "control.curve_readonly_keys_file is set but control.endpoint ipc://$T/aclipc/ctl is not tcp://" "$T/aclipc.out"; then
    ok curve_key_list_needs_tcp
else
    fail curve_key_list_needs_tcp "$(tail -2 "$T/aclipc.out")"
fi

# a malformed allow-list: dflashd refuses to start, naming the file and line
printf '%s\nnot-a-key\n' "$(cat "$T/keys/alice.pub")" >"$T/bad.keys"
sed "s|^curve_client_keys_file = .*|curve_client_keys_file = $T/bad.keys|; s|^run_dir = .*|run_dir = $T/acl-bad|; s|^name = .*|name = t$$-aclbad|" \
    "$T/acl.ini" >"$T/aclbad.ini"
if run_job aclbad; then fail curve_bad_allow_list_refused "dflash run exit 0"
elif grep -qF "$T/bad.keys:2: not a CURVE public key of 40 Z85 characters (control.curve_client_keys_file)" "$T/aclbad.out"; then
    ok curve_bad_allow_list_refused
else
    fail curve_bad_allow_list_refused "$(tail -2 "$T/aclbad.out")"
fi
exit $FAILED
