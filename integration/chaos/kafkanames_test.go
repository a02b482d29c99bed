package chaos

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/millrace/watermill-outbox/forwarder/kafka"
)

// Two chaos runs against one cluster never fence or share each other:
// each creates the scenario's Kafka topics under names of its own, with
// the scenario's partition counts (equal and unequal), and gives its
// exactly-once forwarders a transactional id prefix and its inbox
// consumers a Kafka consumer group of their own; its forwarders and inbox
// consumers dial the brokers through its proxies. On kfake or on the
// cluster of OUTBOX_TEST_KAFKA_BROKERS alike.
func TestChaosRunsUseKafkaNamesOfTheirOwn(t *testing.T) {
	if _, child, _ := ChildFromEnv(); child {
		t.Skip("a child process")
	}
	owner := map[string]int{} // a Kafka name → the run that uses it
	claim := func(run int, what, name string) {
		t.Helper()
		if name == "" {
			t.Errorf("run %d: an empty %s", run, what)
			return
		}
		if o, ok := owner[name]; ok && o != run {
			t.Errorf("run %d: %s %q is run %d's too", run, what, name, o)
		}
		owner[name] = run
	}
	for n := 0; n < 2; n++ {
		r := newRun(t, 1, time.Second, false, kafkaExactlyOnce)
		r.setUpKafka()

		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		md, err := r.kafka.Admin().ListTopics(ctx, mapValues(r.kafkaTopics)...)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		for base, partitions := range r.sc.kafkaTopics {
			name := r.kafkaTopics[base]
			if name == base {
				t.Errorf("run %d: topic %s has the scenario's name", n, base)
			}
			if got := len(md[name].Partitions); got != partitions {
				t.Errorf("run %d: topic %s (%s) has %d partitions, want %d", n, name, base, got, partitions)
			}
		}

		forwarders, inboxes := 0, 0
		for _, role := range r.sc.children {
			for i := 1; i <= role.count; i++ {
				cfg := r.childConfig(role, i, "postgres://unused")
				if cfg.KafkaTopic != r.kafkaTopics[role.topic()] {
					t.Errorf("run %d: %s writes or reads Kafka topic %q, want %q", n, cfg.Name, cfg.KafkaTopic, r.kafkaTopics[role.topic()])
				}
				if !slices.Equal(cfg.Brokers, r.kafka.Brokers) || len(cfg.BrokerMap) == 0 {
					t.Errorf("run %d: %s has brokers %v and broker map %v", n, cfg.Name, cfg.Brokers, cfg.BrokerMap)
				}
				for from, to := range r.brokerProxies.Addrs() {
					if cfg.BrokerMap[from] != to {
						t.Errorf("run %d: %s dials %s through %q, want the proxy %s", n, cfg.Name, from, cfg.BrokerMap[from], to)
					}
				}
				switch role.role {
				case RoleForwarder:
					forwarders++
					if cfg.TransactionalIDPrefix == kafka.DefaultTransactionalIDPrefix {
						t.Errorf("run %d: %s has the default transactional id prefix", n, cfg.Name)
					}
					claim(n, "transactional id prefix", cfg.TransactionalIDPrefix)
				case RoleInbox:
					inboxes++
					if cfg.KafkaGroup == role.group {
						t.Errorf("run %d: %s's consumer group is the scenario's name", n, cfg.Name)
					}
					claim(n, "consumer group", cfg.KafkaGroup)
				}
				claim(n, "topic", cfg.KafkaTopic)
			}
		}
		if forwarders == 0 || inboxes == 0 {
			t.Fatalf("the scenario has %d forwarders and %d inbox consumers", forwarders, inboxes)
		}
	}
}

func mapValues(m map[string]string) []string {
	var out []string
	for _, v := range m {
		out = append(out, v)
	}
	return out
}
