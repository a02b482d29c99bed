package partitioning_test

import (
	"errors"
	"fmt"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/partitioning"
)

func ExampleDefault() {
	p := partitioning.Default()
	for _, key := range []string{"order-42", "customer-7", "foobar"} {
		n, err := p.Partition(key, 16)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("%s -> partition %d\n", key, n)
	}
	_, err := p.Partition("foobar", 0)
	fmt.Println(errors.Is(err, outbox.ErrInvalidPartitionCount))
	// Output:
	// order-42 -> partition 0
	// customer-7 -> partition 7
	// foobar -> partition 14
	// true
}

func ExampleMurmur2Hash() {
	fmt.Println(partitioning.Murmur2Hash([]byte("foobar")))
	// Output: -790332482
}

func ExamplePartitionerFunc() {
	// Send every key to partition 0, e.g. to force total order in tests.
	single := partitioning.PartitionerFunc(func(_ string, n int) (int, error) {
		return 0, partitioning.ValidatePartitions(n)
	})
	fmt.Println(single.Partition("any", 8))
	// Output: 0 <nil>
}
