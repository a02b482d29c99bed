package bench

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// A layout is one way to store messages and sequence them, in raw SQL on
// throwaway tables. All layouts share the partitions table (the sequencer's
// per-partition lock and high-water mark, as in migrations/0001_core.sql),
// the publishing pattern (one multi-row INSERT ... SELECT FROM unnest per
// transaction) and the sequencing loop of outbox.Sequencer.Pass: lock the
// partitions with work (FOR UPDATE SKIP LOCKED), then number up to
// seqBatchSize/partitions oldest rows of each in one statement, commit.
//
// Autovacuum is off on these tables so that the WAL of each phase is the
// WAL of its statements only (vacuum of the dead rows a layout leaves is
// not measured); ANALYZE runs between publishing and sequencing.
type layout struct {
	name    string
	ddl     string // {{s}} is the quoted schema
	publish string // $1 topic, $2 partitions, $3 keys, $4 uuids, $5 metadata, $6 payloads
	lock    string // $1 max partitions
	move    string // $1 topics, $2 partitions, $3 share; returns the count sequenced
	read    string // $1 topic, $2 partition, $3 after seq, $4 limit; returns seq, key, uuid, metadata, payload
	analyze string
	checks  []string // queries that must return 0 after sequencing everything
	logged  string   // counts sequenced messages
}

const noAutovacuum = `WITH (autovacuum_enabled = false, toast.autovacuum_enabled = false)`

const partitionsDDL = `
CREATE TABLE {{s}}.partitions (
    topic        text        NOT NULL,
    partition    integer     NOT NULL,
    last_seq     bigint      NOT NULL DEFAULT 0,
    sequenced_at timestamptz,
    PRIMARY KEY (topic, partition)
) ` + noAutovacuum + `;
INSERT INTO {{s}}.partitions (topic, partition) SELECT 'bench', g FROM generate_series(0, 15) AS g;
`

const unnestRows = `unnest($2::int4[], $3::text[], $4::text[], $5::text[], $6::bytea[]) WITH ORDINALITY AS x(p, k, u, m, b, ord)`

// lockSQL is the Sequencer's statement 1 with the "has work" test varying
// per layout.
func lockSQL(hasWork string) string {
	return `SELECT p.topic, p.partition FROM {{s}}.partitions p
	WHERE EXISTS (` + hasWork + `)
	ORDER BY p.sequenced_at NULLS FIRST
	LIMIT $1
	FOR UPDATE OF p SKIP LOCKED`
}

// advanceSQL ends every move statement: it moves the partitions' high-water
// marks and returns how many messages were sequenced.
const advanceSQL = `advanced AS (
		UPDATE {{s}}.partitions p SET last_seq = x.max_seq, sequenced_at = now()
		FROM (SELECT topic, partition, max(seq) AS max_seq, count(*) AS n FROM done GROUP BY topic, partition) x
		WHERE p.topic = x.topic AND p.partition = x.partition
		RETURNING x.n
	)
	SELECT coalesce(sum(n), 0)::bigint FROM advanced`

var layouts = []layout{
	{
		// (a) The current design: publishers write whole rows into pending;
		// the sequencer deletes them and inserts them, numbered, into log.
		name: "move",
		ddl: partitionsDDL + `
CREATE TABLE {{s}}.pending (
    id            bigint      GENERATED ALWAYS AS IDENTITY,
    topic         text        NOT NULL,
    partition     integer     NOT NULL,
    partition_key text,
    uuid          text        NOT NULL,
    metadata      jsonb       NOT NULL,
    payload       bytea       NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now()
) ` + noAutovacuum + `;
CREATE INDEX ON {{s}}.pending (topic, partition, id);
CREATE TABLE {{s}}.log (
    topic         text        NOT NULL,
    partition     integer     NOT NULL,
    seq           bigint      NOT NULL,
    partition_key text,
    uuid          text        NOT NULL,
    metadata      jsonb       NOT NULL,
    payload       bytea       NOT NULL,
    created_at    timestamptz NOT NULL,
    sequenced_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (topic, partition, seq)
) ` + noAutovacuum + `;`,
		publish: `INSERT INTO {{s}}.pending (topic, partition, partition_key, uuid, metadata, payload)
	SELECT $1, x.p, NULLIF(x.k, ''), x.u, x.m::jsonb, x.b FROM ` + unnestRows + ` ORDER BY x.ord`,
		lock: lockSQL(`SELECT 1 FROM {{s}}.pending m WHERE m.topic = p.topic AND m.partition = p.partition`),
		// The statement of outbox.Sequencer (without its NOTIFY).
		move: `WITH locked AS (
		SELECT * FROM unnest($1::text[], $2::int4[]) AS l(topic, partition)
	), picked AS (
		SELECT m.topic, m.partition, m.id FROM locked l
		CROSS JOIN LATERAL (
			SELECT topic, partition, id FROM {{s}}.pending m
			WHERE m.topic = l.topic AND m.partition = l.partition
			ORDER BY id LIMIT $3
		) m
	), moved AS (
		DELETE FROM {{s}}.pending d USING picked
		WHERE d.topic = picked.topic AND d.partition = picked.partition AND d.id = picked.id
		RETURNING d.*
	), numbered AS (
		SELECT mv.*, p.last_seq + row_number() OVER (PARTITION BY mv.topic, mv.partition ORDER BY mv.id) AS seq
		FROM moved mv JOIN {{s}}.partitions p ON p.topic = mv.topic AND p.partition = mv.partition
	), done AS (
		INSERT INTO {{s}}.log (topic, partition, seq, partition_key, uuid, metadata, payload, created_at)
		SELECT topic, partition, seq, partition_key, uuid, metadata, payload, created_at
		FROM numbered ORDER BY topic, partition, seq
		RETURNING topic, partition, seq
	), ` + advanceSQL,
		read: `SELECT seq, partition_key, uuid, metadata, payload FROM {{s}}.log
	WHERE topic = $1 AND partition = $2 AND seq > $3 ORDER BY seq LIMIT $4`,
		analyze: `ANALYZE {{s}}.pending; ANALYZE {{s}}.log; ANALYZE {{s}}.partitions`,
		checks:  []string{`SELECT count(*) FROM {{s}}.pending`},
		logged:  `SELECT count(*) FROM {{s}}.log`,
	},
	{
		// (b) Body table: publishers write the message once into bodies and a
		// small row into pending; the sequencer moves only small rows into a
		// log of (topic, partition, seq, body_id); readers join.
		name: "body",
		ddl: partitionsDDL + `
CREATE SEQUENCE {{s}}.body_id_seq;
CREATE TABLE {{s}}.bodies (
    id            bigint      PRIMARY KEY,
    partition_key text,
    uuid          text        NOT NULL,
    metadata      jsonb       NOT NULL,
    payload       bytea       NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now()
) ` + noAutovacuum + `;
CREATE TABLE {{s}}.pending (
    topic     text    NOT NULL,
    partition integer NOT NULL,
    body_id   bigint  NOT NULL
) ` + noAutovacuum + `;
CREATE INDEX ON {{s}}.pending (topic, partition, body_id);
CREATE TABLE {{s}}.log (
    topic        text        NOT NULL,
    partition    integer     NOT NULL,
    seq          bigint      NOT NULL,
    body_id      bigint      NOT NULL,
    sequenced_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (topic, partition, seq)
) ` + noAutovacuum + `;`,
		// Body ids come from one sequence in call order, like pending.id in
		// (a), so they order a partition's rows the same way.
		publish: `WITH x AS MATERIALIZED (
		SELECT nextval('{{s}}.body_id_seq') AS id, x.p, x.k, x.u, x.m, x.b FROM ` + unnestRows + ` ORDER BY x.ord
	), body AS (
		INSERT INTO {{s}}.bodies (id, partition_key, uuid, metadata, payload)
		SELECT id, NULLIF(k, ''), u, m::jsonb, b FROM x
	)
	INSERT INTO {{s}}.pending (topic, partition, body_id) SELECT $1, p, id FROM x`,
		lock: lockSQL(`SELECT 1 FROM {{s}}.pending m WHERE m.topic = p.topic AND m.partition = p.partition`),
		move: `WITH locked AS (
		SELECT * FROM unnest($1::text[], $2::int4[]) AS l(topic, partition)
	), picked AS (
		SELECT m.topic, m.partition, m.body_id FROM locked l
		CROSS JOIN LATERAL (
			SELECT topic, partition, body_id FROM {{s}}.pending m
			WHERE m.topic = l.topic AND m.partition = l.partition
			ORDER BY body_id LIMIT $3
		) m
	), moved AS (
		DELETE FROM {{s}}.pending d USING picked
		WHERE d.topic = picked.topic AND d.partition = picked.partition AND d.body_id = picked.body_id
		RETURNING d.*
	), numbered AS (
		SELECT mv.*, p.last_seq + row_number() OVER (PARTITION BY mv.topic, mv.partition ORDER BY mv.body_id) AS seq
		FROM moved mv JOIN {{s}}.partitions p ON p.topic = mv.topic AND p.partition = mv.partition
	), done AS (
		INSERT INTO {{s}}.log (topic, partition, seq, body_id)
		SELECT topic, partition, seq, body_id FROM numbered ORDER BY topic, partition, seq
		RETURNING topic, partition, seq
	), ` + advanceSQL,
		read: `SELECT l.seq, b.partition_key, b.uuid, b.metadata, b.payload
	FROM {{s}}.log l JOIN {{s}}.bodies b ON b.id = l.body_id
	WHERE l.topic = $1 AND l.partition = $2 AND l.seq > $3 ORDER BY l.seq LIMIT $4`,
		analyze: `ANALYZE {{s}}.pending; ANALYZE {{s}}.log; ANALYZE {{s}}.bodies; ANALYZE {{s}}.partitions`,
		checks: []string{
			`SELECT count(*) FROM {{s}}.pending`,
			`SELECT count(*) FROM {{s}}.log l WHERE NOT EXISTS (SELECT 1 FROM {{s}}.bodies b WHERE b.id = l.body_id)`,
		},
		logged: `SELECT count(*) FROM {{s}}.log`,
	},
	{
		// (c) Update in place: one table; seq is NULL until sequenced, a
		// partial index finds the unsequenced rows, the sequencer sets seq.
		// seq and sequenced_at sit next to each other near the front of the
		// row. The sequencer finds the rows it numbers by ctid (the rows of a
		// locked partition cannot move under it).
		name: "inplace",
		ddl: partitionsDDL + `
CREATE TABLE {{s}}.msgs (
    id            bigint      GENERATED ALWAYS AS IDENTITY,
    topic         text        NOT NULL,
    partition     integer     NOT NULL,
    seq           bigint,
    sequenced_at  timestamptz,
    partition_key text,
    uuid          text        NOT NULL,
    metadata      jsonb       NOT NULL,
    payload       bytea       NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now()
) ` + noAutovacuum + `;
CREATE INDEX ON {{s}}.msgs (topic, partition, id) WHERE seq IS NULL;
CREATE UNIQUE INDEX ON {{s}}.msgs (topic, partition, seq) WHERE seq IS NOT NULL;`,
		publish: `INSERT INTO {{s}}.msgs (topic, partition, partition_key, uuid, metadata, payload)
	SELECT $1, x.p, NULLIF(x.k, ''), x.u, x.m::jsonb, x.b FROM ` + unnestRows + ` ORDER BY x.ord`,
		lock: lockSQL(`SELECT 1 FROM {{s}}.msgs m WHERE m.topic = p.topic AND m.partition = p.partition AND m.seq IS NULL`),
		move: `WITH locked AS (
		SELECT * FROM unnest($1::text[], $2::int4[]) AS l(topic, partition)
	), picked AS (
		SELECT m.topic, m.partition, m.id, m.ctid AS tid FROM locked l
		CROSS JOIN LATERAL (
			SELECT topic, partition, id, ctid FROM {{s}}.msgs m
			WHERE m.topic = l.topic AND m.partition = l.partition AND m.seq IS NULL
			ORDER BY id LIMIT $3
		) m
	), numbered AS (
		SELECT pk.*, p.last_seq + row_number() OVER (PARTITION BY pk.topic, pk.partition ORDER BY pk.id) AS seq
		FROM picked pk JOIN {{s}}.partitions p ON p.topic = pk.topic AND p.partition = pk.partition
	), done AS (
		-- By ctid: a join on (topic, partition, id) lets the planner pick a
		-- hash join over a sequential scan of the whole table, history
		-- included, in every pass.
		UPDATE {{s}}.msgs m SET seq = n.seq, sequenced_at = now()
		FROM numbered n
		WHERE m.ctid = n.tid AND m.seq IS NULL
		RETURNING m.topic, m.partition, m.seq
	), ` + advanceSQL,
		read: `SELECT seq, partition_key, uuid, metadata, payload FROM {{s}}.msgs
	WHERE topic = $1 AND partition = $2 AND seq > $3 ORDER BY seq LIMIT $4`,
		analyze: `ANALYZE {{s}}.msgs; ANALYZE {{s}}.partitions`,
		checks:  []string{`SELECT count(*) FROM {{s}}.msgs WHERE seq IS NULL`},
		logged:  `SELECT count(*) FROM {{s}}.msgs WHERE seq IS NOT NULL`,
	},
}

// layoutResult holds the three phases of one layout run.
type layoutResult struct {
	publish, sequence, read phase
}

// runLayout publishes n messages of the given payload size into a fresh
// copy of layout l (4 goroutines, 100 per transaction), sequences them all
// with one sequencer connection, then reads them all back partition by
// partition in seq order, checking that every partition's seqs run 1, 2, 3…
// Publishing and sequencing are timed; reading is measured but untimed.
func runLayout(ctx context.Context, e *env, t timer, l layout, size, n int) (layoutResult, error) {
	var res layoutResult
	schema, err := e.newSchema(ctx, "lay")
	if err != nil {
		return res, err
	}
	defer func() { _ = e.dropSchema(context.WithoutCancel(ctx), schema) }()
	q := func(s string) string { return sqlFor(schema, s) }
	if err := e.ddl(ctx, schema, l.ddl); err != nil {
		return res, fmt.Errorf("%s: ddl: %w", l.name, err)
	}
	if err := e.maybeCheckpoint(ctx); err != nil {
		return res, err
	}

	publish := q(l.publish)
	res.publish, err = e.measure(ctx, t, n, func() error {
		return e.publishConcurrently(ctx, n, 100, size, func(ctx context.Context, tx pgx.Tx, g *gen, k int) error {
			parts := make([]int32, k)
			ks := make([]string, k)
			uuids := make([]string, k)
			metas := make([]string, k)
			payloads := make([][]byte, k)
			for i := range k {
				key := g.key()
				parts[i], ks[i], uuids[i], metas[i], payloads[i] = keyParts[key], keys[key], newUUID(g), keyMeta[key], g.payload
			}
			_, err := tx.Exec(ctx, publish, topic, parts, ks, uuids, metas, payloads)
			return err
		})
	})
	if err != nil {
		return res, fmt.Errorf("%s: publish: %w", l.name, err)
	}
	if _, err := e.admin.Exec(ctx, q(l.analyze)); err != nil {
		return res, err
	}

	res.sequence, err = e.measure(ctx, t, n, func() error {
		got, err := sequenceAllRaw(ctx, e.workers[0], q(l.lock), q(l.move))
		if err == nil && got != n {
			err = fmt.Errorf("sequenced %d, want %d", got, n)
		}
		return err
	})
	if err != nil {
		return res, fmt.Errorf("%s: sequence: %w", l.name, err)
	}

	res.read, err = e.measure(ctx, noTimer{}, n, func() error {
		got, err := readAll(ctx, e.workers[0], q(l.read))
		if err == nil && got != n {
			err = fmt.Errorf("read %d, want %d", got, n)
		}
		return err
	})
	if err != nil {
		return res, fmt.Errorf("%s: read: %w", l.name, err)
	}
	for _, c := range l.checks {
		if bad, err := e.count(ctx, q(c)); err != nil || bad != 0 {
			return res, fmt.Errorf("%s: check %q: %d, %v", l.name, c, bad, err)
		}
	}
	if got, err := e.count(ctx, q(l.logged)); err != nil || got != n {
		return res, fmt.Errorf("%s: %d messages sequenced, want %d (%v)", l.name, got, n, err)
	}
	return res, nil
}

// newUUID makes a random version-4 UUID string from the generator's RNG
// (cheaper than crypto/rand; the layouts compare server-side work).
func newUUID(g *gen) string {
	var b [16]byte
	hi, lo := g.rng.Uint64(), g.rng.Uint64()
	for i := range 8 {
		b[i], b[8+i] = byte(hi>>(8*i)), byte(lo>>(8*i))
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

// sequenceAllRaw runs sequencing passes like outbox.Sequencer.Pass until a
// pass finds no partition with work, and returns how many messages it
// numbered.
func sequenceAllRaw(ctx context.Context, conn *pgx.Conn, lock, move string) (int, error) {
	total := 0
	for {
		n, err := func() (int, error) {
			tx, err := conn.Begin(ctx)
			if err != nil {
				return 0, err
			}
			defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
			rows, err := tx.Query(ctx, lock, 256)
			if err != nil {
				return 0, err
			}
			var topics []string
			var parts []int32
			for rows.Next() {
				var t string
				var p int32
				if err := rows.Scan(&t, &p); err != nil {
					rows.Close()
					return 0, err
				}
				topics, parts = append(topics, t), append(parts, p)
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return 0, err
			}
			if len(topics) == 0 {
				return 0, tx.Commit(ctx)
			}
			var n int
			if err := tx.QueryRow(ctx, move, topics, parts, max(1, seqBatchSize/len(topics))).Scan(&n); err != nil {
				return 0, err
			}
			if n == 0 {
				return 0, fmt.Errorf("a pass locked %d partitions with work and sequenced nothing", len(topics))
			}
			return n, tx.Commit(ctx)
		}()
		if err != nil || n == 0 {
			return total, err
		}
		total += n
	}
}

// readAll reads every partition of the topic from seq 1 in pages, as a
// consumer would, checks that seqs have no gap and returns the row count.
func readAll(ctx context.Context, conn *pgx.Conn, read string) (int, error) {
	total := 0
	for p := range partitionCount {
		last := int64(0)
		for {
			rows, err := conn.Query(ctx, read, topic, p, last, readPage)
			if err != nil {
				return total, err
			}
			got := 0
			for rows.Next() {
				var (
					seq           int64
					key           *string
					uuid          string
					meta, payload []byte
				)
				if err := rows.Scan(&seq, &key, &uuid, &meta, &payload); err != nil {
					rows.Close()
					return total, err
				}
				if seq != last+1 {
					rows.Close()
					return total, fmt.Errorf("partition %d: seq %d after %d", p, seq, last)
				}
				last = seq
				got++
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return total, err
			}
			total += got
			if got < readPage {
				break
			}
		}
	}
	return total, nil
}

// BenchmarkSequencerLayout compares the three layouts for 256 B and 4 KiB
// payloads. One op is one message published and sequenced; the timer covers
// both phases. Reported: publish, sequence, combined and read rates, and
// the WAL each phase wrote per message.
func BenchmarkSequencerLayout(b *testing.B) {
	e := newEnv(b, true)
	for _, size := range []int{256, 4096} {
		b.Run(fmt.Sprintf("payload=%d", size), func(b *testing.B) {
			var names []string
			for r := 0; r < *rounds; r++ {
				for _, l := range layouts {
					b.Run(l.name, func(b *testing.B) { benchLayout(b, e, l, size) })
					if r == 0 {
						names = append(names, l.name)
					}
				}
			}
			printMedians(b.Name(), names, []string{"pub-msgs/s", "seq-msgs/s", "msgs/s", "read-msgs/s",
				"pub-WAL-B/msg", "seq-WAL-B/msg", "WAL-B/msg", "pub-cpu-us/msg", "seq-cpu-us/msg", "cpu-us/msg"})
			var lines []string
			for _, l := range layouts[1:] {
				var parts []string
				for _, metric := range []string{"pub-msgs/s", "seq-msgs/s", "msgs/s", "read-msgs/s", "WAL-B/msg", "pub-cpu-us/msg", "seq-cpu-us/msg", "cpu-us/msg"} {
					v, okV := lookup(b.Name()+"/"+l.name, metric)
					base, okB := lookup(b.Name()+"/move", metric)
					parts = append(parts, metric+" "+ratio(v, base, okV, okB))
				}
				lines = append(lines, fmt.Sprintf("%s: ratio of medians %s/move: %s", b.Name(), l.name, strings.Join(parts, ", ")))
			}
			fmt.Println(strings.Join(lines, "\n"))
		})
	}
}

func benchLayout(b *testing.B, e *env, l layout, size int) {
	b.StopTimer()
	b.ResetTimer()
	res, err := runLayout(context.Background(), e, b, l, size, b.N)
	if err != nil {
		b.Fatal(err)
	}
	warnCheckpoints(b, "publish", res.publish)
	warnCheckpoints(b, "sequence", res.sequence)
	combined := float64(b.N) / (res.publish.dur + res.sequence.dur).Seconds()
	m := map[string]float64{
		"pub-msgs/s":    res.publish.rate(),
		"seq-msgs/s":    res.sequence.rate(),
		"msgs/s":        combined,
		"read-msgs/s":   res.read.rate(),
		"pub-WAL-B/msg": res.publish.walPerMsg(),
		"seq-WAL-B/msg": res.sequence.walPerMsg(),
		"WAL-B/msg":     float64(res.publish.walBytes+res.sequence.walBytes) / float64(b.N),
	}
	addCPU(m, "pub-", res.publish)
	addCPU(m, "seq-", res.sequence)
	addCPU(m, "", res.publish, res.sequence)
	if l.name != "move" {
		if base, ok := lookup(sibling(b.Name(), "move"), "msgs/s"); ok {
			m["x-move"] = combined / base
		}
	}
	report(b, m)
}
