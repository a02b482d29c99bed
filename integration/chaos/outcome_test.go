package chaos

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	outbox "github.com/millrace/watermill-outbox"
)

// lag returns how many (group, partition) cursors are behind the log,
// plus the pending messages, and a description of the laggards.
func (r *run) lag(ctx context.Context) (n, inboxMissing int, desc string, err error) {
	n, inboxMissing, desc, err = r.lagOf(ctx)
	return
}

func (r *run) lagOf(ctx context.Context) (int, int, string, error) {
	inboxMissing := 0
	var pending int
	if err := r.pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.pending`).Scan(&pending); err != nil {
		return 0, 0, "", err
	}
	rows, err := r.pool.Query(ctx, `
		SELECT g.name, p.partition, p.last_seq, coalesce(c.seq, 0), coalesce(c.last_error, ''), coalesce(c.lease_owner, ''), c.lease_expires_at > now()
		FROM `+schema+`.partitions p
		CROSS JOIN unnest($2::text[]) AS g(name)
		LEFT JOIN `+schema+`.cursors c ON c.group_name = g.name AND c.topic = p.topic AND c.partition = p.partition
		WHERE p.topic = $1 AND coalesce(c.seq, 0) < p.last_seq
		ORDER BY 1, 2`, topic, r.outboxGroups())
	if err != nil {
		return 0, 0, "", err
	}
	defer rows.Close()
	var b strings.Builder
	n := pending
	if pending > 0 {
		fmt.Fprintf(&b, "%d messages not sequenced; ", pending)
	}
	// An inbox consumer is done when it handled every message of the log.
	for _, c := range r.sc.children {
		if c.role != RoleInbox {
			continue
		}
		var missing int
		if err := r.pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.log l WHERE l.topic = $1 AND NOT EXISTS (
			SELECT FROM `+schema+`.`+ResultsTable+` r WHERE r.grp = $2 AND r.outbox_id = l.topic || '/' || l.partition || '/' || l.seq)`,
			topic, c.group).Scan(&missing); err != nil {
			return 0, 0, "", err
		}
		if missing > 0 {
			n += missing
			inboxMissing += missing
			fmt.Fprintf(&b, "\n    inbox consumer %s: %d messages not handled", c.group, missing)
		}
	}
	for rows.Next() {
		var group, lastErr, owner string
		var partition int
		var head, cursor int64
		var leased *bool
		if err := rows.Scan(&group, &partition, &head, &cursor, &lastErr, &owner, &leased); err != nil {
			return 0, 0, "", err
		}
		n++
		fmt.Fprintf(&b, "\n    %s partition %d: cursor %d of %d, lease %q (live %v), last error %q", group, partition, cursor, head, owner, leased != nil && *leased, lastErr)
	}
	return n, inboxMissing, b.String(), rows.Err()
}

// outboxGroups are the consumer groups of the outbox in the scenario.
func (r *run) outboxGroups() []string {
	var groups []string
	for _, c := range r.sc.children {
		if c.role != RoleInbox && c.role != RoleRelay {
			groups = append(groups, c.group)
		}
	}
	return groups
}

// inboxStall is how long the drain lets the inbox consumers (a Kafka
// consumer group) make no progress before it restarts them.
const inboxStall = 20 * time.Second

// drain waits until everything committed was sequenced and every group's
// cursors reached the log's heads; it reports whether that happened in
// time.
func (r *run) drain(timeout time.Duration) bool {
	t := r.t
	ctx, cancel := context.WithTimeout(r.ctx, timeout)
	defer cancel()
	r.rec.resolve(ctx, t, r.pool)
	if r.sc.wal {
		if err := r.waitRelayed(ctx); err != nil {
			t.Errorf("stall: the relays did not append everything committed %v after the chaos ended (seed %d): %v", timeout, r.seed, err)
			return false
		}
		t.Logf("%6.1fs: the relays appended everything committed", time.Since(r.started).Seconds())
	}
	lastLog := time.Now()
	least, progressAt := -1, time.Now()
	for {
		n, inboxMissing, desc, err := r.lag(ctx)
		if err == nil && (least < 0 || n < least) {
			least, progressAt = n, time.Now()
		}
		if err == nil && n > 0 && n == inboxMissing && time.Since(progressAt) > inboxStall {
			// Only the inbox consumers lag, and have not moved for a while:
			// the Kafka consumer group (sarama on kfake) has stalled, which
			// is not what this test is about. Restart them, as a
			// supervisor's liveness probe would, and say so.
			var waiting, inTx int
			_ = r.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE wait_event_type = 'Lock'), count(*) FILTER (WHERE state LIKE 'idle in transaction%')
				FROM pg_stat_activity WHERE backend_type = 'client backend'`).Scan(&waiting, &inTx)
			t.Logf("%6.1fs: the inbox consumers made no progress for %v with %d messages to go: restarting them (a stalled Kafka consumer group; "+
				"meanwhile %d sessions wait for a lock and %d are idle in a transaction)",
				time.Since(r.started).Seconds(), inboxStall, n, waiting, inTx)
			for _, p := range r.procs {
				if p.Role == RoleInbox {
					p.Kill()
					if err := p.Start(); err != nil {
						t.Errorf("restart %s: %v", p.Name, err)
					}
				}
			}
			r.inboxRestarts++
			progressAt = time.Now()
		}
		if err == nil && n == 0 {
			r.drainedAt = time.Now()
			t.Logf("%6.1fs: drained in %v", time.Since(r.started).Seconds(), time.Since(r.chaosEnded).Round(100*time.Millisecond))
			return true
		}
		if time.Since(lastLog) > 15*time.Second {
			t.Logf("%6.1fs: draining: %d behind (err %v): %s", time.Since(r.started).Seconds(), n, err, desc)
			lastLog = time.Now()
		}
		if !sleep(ctx, 250*time.Millisecond) {
			qctx, qcancel := context.WithTimeout(r.ctx, 10*time.Second)
			_, _, desc, err := r.lag(qctx)
			qcancel()
			t.Errorf("stall: not drained %v after the chaos ended (seed %d); behind: %s (err %v)", timeout, r.seed, desc, err)
			for _, p := range r.procs {
				t.Logf("%s: %+v", p.Name, p.Stats())
			}
			return false
		}
	}
}

// stopChildren stops every child gracefully; one that does not stop in
// time is a fault (a Close that hangs).
func (r *run) stopChildren() {
	var wg sync.WaitGroup
	var mu sync.Mutex
	for _, p := range r.procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := p.Stop(20 * time.Second); err != nil {
				mu.Lock()
				r.stopErrors = append(r.stopErrors, err.Error())
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	sort.Strings(r.stopErrors)
	for _, e := range r.stopErrors {
		r.t.Errorf("a child did not stop cleanly: %s", e)
	}
}

// collect reads back everything the run produced.
func (r *run) collect() Input {
	t := r.t
	ctx, cancel := context.WithTimeout(r.ctx, 2*time.Minute)
	defer cancel()
	in := Input{Messages: r.rec.messages()}

	var log []Delivery
	// A payload of 1 KiB or more is in bodies (log.body_id).
	rows, err := r.pool.Query(ctx, `SELECT l.partition, l.seq, l.uuid, coalesce(l.partition_key, ''), convert_from(coalesce(l.payload, b.payload), 'UTF8')
		FROM `+schema+`.log l LEFT JOIN `+schema+`.bodies b ON b.id = l.body_id WHERE l.topic = $1 ORDER BY l.partition, l.seq`, topic)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var partition int
		var seq int64
		var d Delivery
		if err := rows.Scan(&partition, &seq, &d.UUID, &d.Key, &d.Payload); err != nil {
			t.Fatal(err)
		}
		d.OutboxID = outbox.StableID(topic, partition, seq)
		log = append(log, d)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}

	results := map[string][]Delivery{}
	rows, err = r.pool.Query(ctx, `SELECT grp, outbox_id, uuid, key, payload FROM `+schema+`.`+ResultsTable+` ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var group string
		var d Delivery
		if err := rows.Scan(&group, &d.OutboxID, &d.UUID, &d.Key, &d.Payload); err != nil {
			t.Fatal(err)
		}
		results[group] = append(results[group], d)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}

	dead := map[string][]DeadLetter{}
	rows, err = r.pool.Query(ctx, `SELECT group_name, partition, seq, uuid, reason FROM `+schema+`.dead_letters
		WHERE topic = $1 ORDER BY id`, topic)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var group string
		var partition *int
		var seq *int64
		var dl DeadLetter
		if err := rows.Scan(&group, &partition, &seq, &dl.UUID, &dl.Reason); err != nil {
			t.Fatal(err)
		}
		if partition != nil && seq != nil {
			dl.OutboxID = outbox.StableID(topic, *partition, *seq)
		}
		dead[group] = append(dead[group], dl)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}

	in.Streams = []Stream{{Name: "log", Reference: true, ExactlyOnce: true, Deliveries: log}}
	// A Kafka topic is exactly once when every forwarder writing to it is.
	kafkaTopics := map[string]*Stream{}
	var kafkaOrder []string
	for _, c := range r.sc.children {
		switch c.role {
		case RoleTransactional:
			in.Streams = append(in.Streams, Stream{Name: "transactional group", ExactlyOnce: true, RejectsPoison: true, MaxAttempts: maxAttempts,
				Deliveries: results[c.group], DeadLetters: dead[c.group]})
		case RoleLeased:
			in.Streams = append(in.Streams, Stream{Name: "leased group", RejectsPoison: true, MaxAttempts: maxAttempts,
				Deliveries: results[c.group], DeadLetters: dead[c.group]})
		case RoleInbox:
			in.Streams = append(in.Streams, Stream{Name: "inbox consumer " + c.group + " (Kafka " + c.topic() + ")", ExactlyOnce: true,
				Deliveries: results[c.group]})
		case RoleForwarder:
			s := kafkaTopics[c.topic()]
			if s == nil {
				// Poison larger than the topic's max.message.bytes must
				// end in the forwarders' dead letters.
				s = &Stream{Name: "kafka " + c.topic(), ExactlyOnce: true, RejectsPoison: r.sc.poisonBytes > 0}
				kafkaTopics[c.topic()] = s
				kafkaOrder = append(kafkaOrder, c.topic())
			}
			s.ExactlyOnce = s.ExactlyOnce && !c.atLeastOnce
			s.DeadLetters = append(s.DeadLetters, dead[c.group]...)
		}
	}
	for _, name := range kafkaOrder {
		s := kafkaTopics[name]
		var err error
		if s.Deliveries, err = readKafka(ctx, r.kafka.Brokers, r.kafkaTopics[name]); err != nil {
			t.Fatalf("reading Kafka topic %s back: %v", name, err)
		}
		if s.ExactlyOnce {
			s.Name += " (exactly once)"
		} else {
			s.Name += " (at least once)"
		}
		in.Streams = append(in.Streams, *s)
	}
	return in
}

// summarize logs what the run did and what the verifier saw.
func (r *run) summarize(report Report, drained bool) {
	t := r.t
	rec := r.rec
	var b strings.Builder
	fmt.Fprintf(&b, "chaos run, seed %d: %v of chaos", r.seed, r.chaosEnded.Sub(r.started).Round(100*time.Millisecond))
	if drained {
		fmt.Fprintf(&b, ", drained in %v", r.drainedAt.Sub(r.chaosEnded).Round(100*time.Millisecond))
	} else {
		b.WriteString(", NOT drained")
	}
	fmt.Fprintf(&b, ", %v in all\n", time.Since(r.started).Round(100*time.Millisecond))
	fmt.Fprintf(&b, "  transactions: %d committed, %d rolled back on purpose, %d failed (server restart), %d in doubt (%d of them had committed), %d held open for a while\n",
		rec.txCommitted.Load(), rec.txRolledBack.Load(), rec.txFailed.Load(), rec.txInDoubt.Load(), rec.inDoubtCommitted.Load(), rec.txHeld.Load())
	if n := rec.txCount.Load(); n > 0 {
		fmt.Fprintf(&b, "  a transaction took %v on average (the publishers aimed at %d messages/s)\n", time.Duration(rec.txNanos.Load()/n).Round(time.Millisecond), *flagRate)
	}
	fmt.Fprintf(&b, "  messages: %d committed (%d poison), %d rolled back, %d in doubt after resolution\n",
		report.Committed, report.Poison, report.RolledBack, report.InDoubt)
	fmt.Fprintf(&b, "  faults injected: %d SIGKILLs (%d of every process of a role at once), %d freezes past the lease (SIGSTOP, SIGCONT), %d PostgreSQL immediate restarts, %d Kafka broker outages\n",
		r.kills.Load(), r.groupKills.Load(), r.pauses.Load(), r.pgRestarts.Load(), r.outages.Load())
	if r.inboxRestarts > 0 {
		fmt.Fprintf(&b, "  after the chaos, the inbox consumers' Kafka consumer group stalled %d time(s) for %v: their processes were restarted\n",
			r.inboxRestarts, inboxStall)
	}
	byRole := map[string][4]int{}
	var selfExits []string
	for _, p := range r.procs {
		st := p.Stats()
		c := byRole[p.Role]
		c[0] += st.Kills
		c[1] += st.Starts
		c[2] += len(st.SelfExits)
		c[3] += st.Pauses
		byRole[p.Role] = c
		for _, e := range st.SelfExits {
			selfExits = append(selfExits, p.Name+": "+e)
		}
	}
	if r.sc.wal {
		c := r.wal.get()
		fmt.Fprintf(&b, "  log-based storm: %d forwarder SIGKILLs (%d skipped: frozen), %d freezes of a forwarder holding leases, "+
			"%d SIGKILLs and %d freezes of the relay streaming the slot (the standby took over during %d), %d poison messages forced\n",
			c.forwarderKills, c.forwarderSkips, c.forwarderFreezes, c.relayKills, c.relayFreezes, c.relayTakeovers, r.forcedPoison.Load())
	}
	for _, role := range []string{RoleRelay, RoleTransactional, RoleLeased, RoleForwarder, RoleInbox} {
		c, ok := byRole[role]
		if !ok {
			continue
		}
		fmt.Fprintf(&b, "  %s processes: %d killed, %d frozen, %d started, %d exited by themselves\n", role, c[0], c[3], c[1], c[2])
	}
	for _, e := range selfExits {
		fmt.Fprintf(&b, "    exited by itself: %s\n", e)
	}
	b.WriteString(indent(report.String(), "  "))
	t.Log("\n" + b.String())
	t.Log(r.resultLine(report, drained))
}

// resultLine is the run's figures on one line, for contended.sh's table:
// CHAOS-RESULT followed by name=value fields.
func (r *run) resultLine(report Report, drained bool) string {
	dead := 0
	for _, s := range report.Streams {
		dead += s.DeadLetters
	}
	c := r.wal.get()
	drain := "-"
	if drained {
		drain = r.drainedAt.Sub(r.chaosEnded).Round(100 * time.Millisecond).String()
	}
	return fmt.Sprintf("CHAOS-RESULT test=%s seed=%d committed=%d poison=%d kills=%d freezes=%d relay_kills=%d relay_freezes=%d relay_takeovers=%d "+
		"pg_restarts=%d outages=%d lost=%d duplicates=%d faults=%d dead_letters=%d chaos=%v drain=%s total=%v load=%s",
		r.t.Name(), r.seed, report.Committed, report.Poison, r.kills.Load(), r.pauses.Load(), c.relayKills, c.relayFreezes, c.relayTakeovers,
		r.pgRestarts.Load(), r.outages.Load(), report.Count(Lost), report.Count(DuplicateExactlyOnce)+report.Count(DuplicateNewID), len(report.Faults), dead,
		r.chaosEnded.Sub(r.started).Round(100*time.Millisecond), drain,
		time.Since(r.started).Round(100*time.Millisecond), loadAverage())
}

// loadAverage is the machine's 1, 5 and 15 minute load averages, from
// /proc/loadavg ("n/a" where there is none).
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) >= 3 {
		return f[0] + "," + f[1] + "," + f[2]
	}
	return "n/a"
}

func indent(s, prefix string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return prefix + strings.Join(lines, "\n"+prefix) + "\n"
}

// checkSelfTest checks, in a -chaos.selftest run, that the verifier caught
// each injected fault in every stream, and nothing else.
func (r *run) checkSelfTest(report Report) {
	t := r.t
	if report.OK() {
		t.Fatalf("self-test: the verifier found nothing, though one fault of each kind was injected")
	}
	if len(r.injected) == 0 {
		t.Fatalf("self-test: nothing was injected")
	}
	streams := []string{}
	for _, s := range report.Streams {
		streams = append(streams, s.Name)
	}
	for kind, key := range r.injected {
		for _, s := range streams {
			caught := false
			for _, f := range report.Faults {
				if f.Kind == kind && f.Stream == s && f.Key == key {
					caught = true
				}
			}
			if !caught {
				t.Errorf("self-test: the injected %q fault (key %s) was not caught in stream %s", kind, key, s)
			}
		}
	}
	for _, f := range report.Faults {
		if want, ok := r.injected[f.Kind]; !ok || f.Key != want {
			t.Errorf("self-test: a fault that was not injected: %s", f)
		}
	}
	if !t.Failed() {
		t.Logf("self-test passed: each injected fault (%v) was caught in every stream, and nothing else", r.injected)
	}
}
