package outbox_test

import (
	"errors"
	"testing"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/adaptive"
	"github.com/millrace/watermill-outbox/deadletter"
	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/outboxtype"
	"github.com/millrace/watermill-outbox/partitioning"
	"github.com/millrace/watermill-outbox/retention"
)

// One error vocabulary: an error from any package of the module matches the
// root sentinel of its kind with errors.Is, so that callers need to know
// only package outbox's names.
func TestEveryPackageMatchesTheRootSentinels(t *testing.T) {
	t.Parallel()
	tuning := adaptive.Default()
	tuning.BatchSize = -1
	_, fwdErr := forwarder.NewForwarder(forwarder.Config{}, nil)
	_, vacErr := retention.NewVacuum(retention.Config{}, nil)
	cases := []struct {
		name string
		err  error
		want error
	}{
		{"partitioning.ValidatePartitions(0)", partitioning.ValidatePartitions(0), outbox.ErrInvalidPartitionCount},
		{"partitioning.ValidatePartitions(MaxPartitions+1)", partitioning.ValidatePartitions(partitioning.MaxPartitions + 1), outbox.ErrInvalidPartitionCount},
		{"adaptive.Tuning.Validate", tuning.Validate(), outbox.ErrInvalidConfig},
		{"forwarder.NewForwarder(zero Config)", fwdErr, outbox.ErrInvalidConfig},
		{"retention.NewVacuum(zero Config)", vacErr, outbox.ErrInvalidConfig},
		{"deadletter.ErrInvalidCursor", deadletter.ErrInvalidCursor, outbox.ErrInvalidArgument},
	}
	for _, c := range cases {
		if c.err == nil {
			t.Errorf("%s: no error", c.name)
			continue
		}
		if !errors.Is(c.err, c.want) {
			t.Errorf("%s = %v: does not match %v", c.name, c.err, c.want)
		}
	}
	var ce *outboxtype.ConfigError
	if !errors.As(tuning.Validate(), &ce) || ce.Field == "" {
		t.Errorf("adaptive's error is not an *outboxtype.ConfigError naming its field: %v", tuning.Validate())
	}
}
