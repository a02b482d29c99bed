#!/usr/bin/env bash
# contended.sh runs chaos tests many times in a row with the CPU contended,
# and tabulates each run's figures and the load average.
#
#   integration/chaos/contended.sh [-n RUNS] [-busy LOOPS] [-run REGEXP] [-out DIR] [-- TEST FLAGS...]
#
#   -n RUNS      rounds (default 20); each round runs every test -run matches
#   -busy LOOPS  busy-loop processes to start first (default 4; 0 for none)
#   -run REGEXP  the tests (default '^(TestChaosKafka|TestChaosKafkaWAL)$')
#   -out DIR     where the logs and the table go (default a new /tmp/chaos-contended-*)
#   TEST FLAGS   given to each run, e.g. -chaos.duration=1m -test.timeout=30m
#
# It builds the test binary once, takes the machine's heavy-run lock
# (/tmp/outbox-heavy.lock, flock) for the whole campaign, starts the busy
# loops, runs the rounds one after the other, and stops the busy loops (by
# their process ids) when it ends, however it ends. Each run's output is
# DIR/round-N.log; a failing run keeps its children's and the server's logs
# (the path is in its output, "logs of the run"). The table, one row per
# test run (from the CHAOS-RESULT line a chaos run ends with, and its
# PASS/FAIL), with uptime's load averages before and after the round, goes
# to DIR/results.md and to standard output. The exit status is 1 when a
# run failed.
set -euo pipefail

runs=20
busy=4
run_re='^(TestChaosKafka|TestChaosKafkaWAL)$'
out=
while (($#)); do
	case $1 in
	-n) runs=$2; shift 2 ;;
	-busy) busy=$2; shift 2 ;;
	-run) run_re=$2; shift 2 ;;
	-out) out=$2; shift 2 ;;
	--) shift; break ;;
	-h | --help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "contended.sh: unknown argument $1 (see -h)" >&2; exit 2 ;;
	esac
done
test_flags=("$@")
[[ $runs =~ ^[0-9]+$ && $runs -ge 1 ]] || { echo "contended.sh: -n wants a positive number" >&2; exit 2; }
[[ $busy =~ ^[0-9]+$ ]] || { echo "contended.sh: -busy wants a number" >&2; exit 2; }

pkg=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
[[ -n $out ]] || out=$(mktemp -d /tmp/chaos-contended-XXXXXX)
mkdir -p "$out"
out=$(cd "$out" && pwd)
bin=$out/chaos.test

echo "building the test binary ($pkg)"
(cd "$pkg" && go test -c -o "$bin" .)

busy_pids=()
test_pid=
stop_busy() {
	local pid
	# A run under way when the script is interrupted goes too (its children
	# die with it).
	[[ -z $test_pid ]] || kill "$test_pid" 2>/dev/null || true
	for pid in "${busy_pids[@]}"; do
		kill "$pid" 2>/dev/null || true
	done
	for pid in "${busy_pids[@]}"; do
		wait "$pid" 2>/dev/null || true
	done
	busy_pids=()
}
trap stop_busy EXIT
trap 'exit 130' INT TERM

exec 9>/tmp/outbox-heavy.lock
echo "waiting for the heavy-run lock (/tmp/outbox-heavy.lock)"
flock 9
echo "lock taken; $(uptime)"

for ((i = 0; i < busy; i++)); do
	# Children of this shell, so that the lock stays with the script (fd 9
	# is not theirs) and stop_busy can end them by id.
	bash -c 'exec 9>&-; while :; do :; done' &
	busy_pids+=($!)
done
((busy == 0)) || echo "started $busy busy loops: ${busy_pids[*]}"

load() { uptime | sed 's/.*load average: //'; }

table=$out/results.md
{
	echo "# chaos runs with $busy busy loops on $(nproc) cores ($(date -u +%Y-%m-%dT%H:%MZ), $(git -C "$pkg" rev-parse --short HEAD 2>/dev/null || echo '?'))"
	echo
	echo "tests: \`$run_re\`, flags: \`${test_flags[*]:-}\`"
	echo
	echo "| round | test | result | committed msgs | poison | SIGKILLs | freezes | relay kills / freezes / takeovers | PG restarts | outages | lost | duplicates | faults | dead letters | chaos | drain | test time | load during (1,5,15) | uptime load before | uptime load after |"
	echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
} >"$table"

failed=0
field() { # field NAME LINE
	local v
	v=$(tr ' ' '\n' <<<"$2" | sed -n "s/^$1=//p" | head -1)
	echo "${v:--}"
}
for ((round = 1; round <= runs; round++)); do
	log=$out/round-$round.log
	before=$(load)
	echo "round $round/$runs: load $before"
	status=0
	(cd "$pkg" && exec "$bin" -test.run "$run_re" -test.v -test.count=1 -test.timeout=20m "${test_flags[@]}") >"$log" 2>&1 &
	test_pid=$!
	wait "$test_pid" || status=$?
	test_pid=
	after=$(load)
	((status == 0)) || failed=1
	# One row per top-level test that ran (--- PASS / --- FAIL), with the
	# figures of its CHAOS-RESULT line when it got that far.
	while read -r verdict name took; do
		[[ $name == TestChaosChild ]] && continue
		line=$(grep -o "CHAOS-RESULT test=$name .*" "$log" | head -1 || true)
		secs=${took//[()]/}
		printf '| %d | %s | %s | %s | %s | %s | %s | %s / %s / %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' \
			"$round" "$name" "$verdict" "$(field committed "$line")" "$(field poison "$line")" "$(field kills "$line")" "$(field freezes "$line")" \
			"$(field relay_kills "$line")" "$(field relay_freezes "$line")" "$(field relay_takeovers "$line")" \
			"$(field pg_restarts "$line")" "$(field outages "$line")" "$(field lost "$line")" "$(field duplicates "$line")" "$(field faults "$line")" \
			"$(field dead_letters "$line")" "$(field chaos "$line")" "$(field drain "$line")" "$secs" "$(field load "$line")" "$before" "$after" >>"$table"
		echo "  $name: $verdict $secs $(sed 's/.*CHAOS-RESULT test=[^ ]* //' <<<"$line")"
	done < <(sed -n 's/^--- \(PASS\|FAIL\): \([A-Za-z0-9_]*\) \(([0-9.]*s)\)$/\1 \2 \3/p' "$log")
	if ((status != 0)); then
		echo "  round $round failed (status $status): $log"
		grep -h "logs of the run" "$log" | sed 's/^ */  /' || true
	fi
done

stop_busy
echo "busy loops stopped; $(uptime)"
{
	echo
	echo "load after the campaign, busy loops stopped: $(load)"
	echo
	awk -F'|' 'NR > 6 && $4 ~ /PASS|FAIL/ {
		t = $3; gsub(/ /, "", t); runs[t]++
		if ($4 ~ /FAIL/) fails[t]++
		l = $12; d = $13; gsub(/ /, "", l); gsub(/ /, "", d)
		if (l ~ /^[0-9]+$/) lost[t] += l
		if (d ~ /^[0-9]+$/) dups[t] += d
	}
	END { for (t in runs) printf "- %s: %d runs, %d failed, %d lost, %d duplicates in all\n", t, runs[t], fails[t], lost[t], dups[t] }' "$table"
} >>"$table"
echo
cat "$table"
echo
echo "table: $table; logs: $out"
exit $failed
