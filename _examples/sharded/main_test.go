package main

import "testing"

// The routing is a contract with the data already written: a customer's
// pending orders sit in its shard's outbox. Were shardOf to change (another
// hash, another number of shards), the customer's next orders would go to
// another database, whose pipeline forwards them in no order with those
// still queued in the old one. These values pin it; change them only with a
// migration of the keys that move.
func TestShardOfIsStable(t *testing.T) {
	for customer, want := range map[string]string{
		"customer-00": "apac",
		"customer-01": "us",
		"customer-02": "eu",
		"customer-17": "apac",
		"customer-29": "us",
	} {
		if got := shards[shardOf(customer)]; got != want {
			t.Errorf("shardOf(%q) = %s, want %s", customer, got, want)
		}
	}
}
