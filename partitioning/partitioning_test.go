package partitioning_test

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/partitioning"
)

// franzPartition returns the partition franz-go's Kafka-compatible default
// partitioner chooses for a record keyed with key among n partitions.
func franzPartition(tp kgo.TopicPartitioner, key []byte, n int) int {
	if key == nil {
		key = []byte{} // a nil key would take the keyless (sticky) path
	}
	return tp.Partition(&kgo.Record{Key: key}, n)
}

func newFranz() kgo.TopicPartitioner {
	return kgo.StickyKeyPartitioner(nil).ForTopic("t")
}

// franzMaskedHash recovers franz-go's murmur2(key) & 0x7fffffff by
// partitioning over 2^31 partitions. It reports false on 32-bit platforms.
func franzMaskedHash(tp kgo.TopicPartitioner, key []byte) (uint32, bool) {
	if strconv.IntSize < 64 {
		return 0, false
	}
	shift := uint(31)
	return uint32(franzPartition(tp, key, 1<<shift)), true
}

// Golden vectors from Kafka's UtilsTest.testMurmur2.
var kafkaHashVectors = []struct {
	in   string
	want int32
}{
	{"21", -973932308},
	{"foobar", -790332482},
	{"a-little-bit-long-string", -985981536},
	{"a-little-bit-longer-string", -1486304829},
	{"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971},
	{"abc", 479470107},
}

func TestMurmur2HashKafkaVectors(t *testing.T) {
	tp := newFranz()
	for _, c := range kafkaHashVectors {
		got := partitioning.Murmur2Hash([]byte(c.in))
		if got != c.want {
			t.Errorf("Murmur2Hash(%q) = %d, want %d", c.in, got, c.want)
		}
		// Cross-check the vector itself against franz-go (low 31 bits).
		if fh, ok := franzMaskedHash(tp, []byte(c.in)); ok && fh != uint32(c.want)&0x7fffffff {
			t.Errorf("franz-go masked hash of %q = %d, want %d", c.in, fh, uint32(c.want)&0x7fffffff)
		}
	}
}

func TestMurmur2PartitionVectors(t *testing.T) {
	// Pinned from franz-go's kgo.StickyKeyPartitioner(nil).
	vectors := []struct {
		key        string
		partitions int
		want       int
	}{
		{"", 1, 0},
		{"", 12, 9},
		{"", 1024, 217},
		{"21", 16, 12},
		{"21", 100, 40},
		{"foobar", 12, 6},
		{"foobar", 16, 14},
		{"foobar", 1024, 958},
		{"abc", 16, 11},
		{"abc", 100, 7},
		{"order-42", 100, 24},
		{"customer-7", 3, 1},
		{"a-little-bit-long-string", 1024, 416},
		{"日本語", 16, 10},
		{"日本語", 1024, 970},
	}
	p := partitioning.Default()
	for _, v := range vectors {
		got, err := p.Partition(v.key, v.partitions)
		if err != nil {
			t.Fatalf("Partition(%q, %d): %v", v.key, v.partitions, err)
		}
		if got != v.want {
			t.Errorf("Partition(%q, %d) = %d, want %d", v.key, v.partitions, got, v.want)
		}
	}
}

// testKeys returns a deterministic mix of keys: every tail length, empty,
// unicode, invalid UTF-8, binary bytes, long and random keys.
func testKeys(random int) []string {
	keys := []string{
		"", "a", "ab", "abc", "abcd", "abcde", "abcdef", "abcdefg", "abcdefgh",
		"日本語", "emoji 🚀🚀", "\xff\xfe\xfd", "\x00", "\x00\x00\x00\x00\x00",
		"\x80\x81\x82\x83\xff\xff\xff\xff", strings.Repeat("x", 10_000),
		strings.Repeat("\xff", 4097),
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range random {
		b := make([]byte, rng.IntN(80))
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		keys = append(keys, string(b))
	}
	return keys
}

func TestMurmur2AgreesWithFranz(t *testing.T) {
	tp := newFranz()
	p := partitioning.Default()
	for _, k := range testKeys(300) {
		if fh, ok := franzMaskedHash(tp, []byte(k)); ok {
			if got := uint32(partitioning.Murmur2Hash([]byte(k))) & 0x7fffffff; got != fh {
				t.Fatalf("masked hash of %q = %d, franz-go %d", k, got, fh)
			}
		}
		for n := partitioning.MinPartitions; n <= partitioning.MaxPartitions; n++ {
			got, err := p.Partition(k, n)
			if err != nil {
				t.Fatalf("Partition(%q, %d): %v", k, n, err)
			}
			if want := franzPartition(tp, []byte(k), n); got != want {
				t.Fatalf("Partition(%q, %d) = %d, franz-go chose %d", k, n, got, want)
			}
		}
	}
}

func TestPartitionInvalidCount(t *testing.T) {
	for _, n := range []int{0, -1, partitioning.MaxPartitions + 1, math.MinInt, math.MaxInt} {
		got, err := partitioning.Default().Partition("key", n)
		if !errors.Is(err, outbox.ErrInvalidPartitionCount) {
			t.Fatalf("Partition(key, %d) = (%d, %v), want ErrInvalidPartitionCount", n, got, err)
		}
		var pce *partitioning.PartitionCountError
		if !errors.As(err, &pce) || pce.Partitions != n {
			t.Fatalf("Partition(key, %d): error %v is not a *PartitionCountError for %d", n, err, n)
		}
		if got != 0 {
			t.Errorf("Partition(key, %d) returned partition %d alongside an error", n, got)
		}
		if err := partitioning.ValidatePartitions(n); !errors.Is(err, outbox.ErrInvalidPartitionCount) {
			t.Errorf("ValidatePartitions(%d) = %v", n, err)
		}
	}
	for _, n := range []int{partitioning.MinPartitions, 7, partitioning.MaxPartitions} {
		if err := partitioning.ValidatePartitions(n); err != nil {
			t.Errorf("ValidatePartitions(%d) = %v, want nil", n, err)
		}
	}
}

func TestPartitionEmptyKeyDeterministic(t *testing.T) {
	p := partitioning.Default()
	for n := partitioning.MinPartitions; n <= partitioning.MaxPartitions; n++ {
		a, errA := p.Partition("", n)
		b, errB := p.Partition("", n)
		if errA != nil || errB != nil || a != b || a < 0 || a >= n {
			t.Fatalf("Partition(\"\", %d) = (%d, %v) then (%d, %v)", n, a, errA, b, errB)
		}
	}
}

func TestMurmur2Distribution(t *testing.T) {
	const keys, partitions = 100_000, 16
	var counts [partitions]int
	p := partitioning.Default()
	for i := range keys {
		got, err := p.Partition("key-"+strconv.Itoa(i), partitions)
		if err != nil {
			t.Fatal(err)
		}
		counts[got]++
	}
	mean := float64(keys) / partitions
	for i, c := range counts {
		if math.Abs(float64(c)-mean) > 0.10*mean {
			t.Errorf("partition %d got %d keys, mean %.0f: outside ±10%%", i, c, mean)
		}
	}
}

func TestMurmur2ZeroAllocs(t *testing.T) {
	p := partitioning.Default()
	key := strings.Repeat("order-", 20)
	allocs := testing.AllocsPerRun(1000, func() {
		if _, err := p.Partition(key, 64); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("Partition allocated %v times per call, want 0", allocs)
	}
}

func TestPartitionerFunc(t *testing.T) {
	var calls int
	var p partitioning.Partitioner = partitioning.PartitionerFunc(func(key string, n int) (int, error) {
		calls++
		if err := partitioning.ValidatePartitions(n); err != nil {
			return 0, err
		}
		return len(key) % n, nil
	})
	if got, err := p.Partition("hello", 3); err != nil || got != 2 {
		t.Fatalf("Partition(hello, 3) = (%d, %v), want (2, nil)", got, err)
	}
	if _, err := p.Partition("hello", 0); !errors.Is(err, outbox.ErrInvalidPartitionCount) {
		t.Fatalf("Partition(hello, 0) error = %v, want ErrInvalidPartitionCount", err)
	}
	if calls != 2 {
		t.Fatalf("func called %d times, want 2", calls)
	}
}

func FuzzMurmur2MatchesFranz(f *testing.F) {
	for _, c := range kafkaHashVectors {
		f.Add([]byte(c.in), uint16(16))
	}
	f.Add([]byte{}, uint16(0))
	f.Add([]byte("\xff\x00\x80"), uint16(1023))
	tp := newFranz()
	p := partitioning.Default()
	f.Fuzz(func(t *testing.T, key []byte, raw uint16) {
		n := int(raw)%partitioning.MaxPartitions + 1
		got, err := p.Partition(string(key), n)
		if err != nil {
			t.Fatalf("Partition(%q, %d): %v", key, n, err)
		}
		if want := franzPartition(tp, key, n); got != want {
			t.Fatalf("Partition(%q, %d) = %d, franz-go chose %d", key, n, got, want)
		}
		if fh, ok := franzMaskedHash(tp, key); ok {
			if h := uint32(partitioning.Murmur2Hash(key)) & 0x7fffffff; h != fh {
				t.Fatalf("masked hash of %q = %d, franz-go %d", key, h, fh)
			}
		}
	})
}

func BenchmarkMurmur2Partition(b *testing.B) {
	p := partitioning.Default()
	for _, size := range []int{8, 36, 256} {
		key := strings.Repeat("k", size)
		b.Run(fmt.Sprintf("key=%dB", size), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(size))
			for b.Loop() {
				if _, err := p.Partition(key, 64); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// One error vocabulary: a partition count error from this package matches
// the outbox's sentinel.
func TestPartitionCountErrorsMatchTheOutboxSentinel(t *testing.T) {
	err := partitioning.ValidatePartitions(partitioning.MaxPartitions + 1)
	if !errors.Is(err, outbox.ErrInvalidPartitionCount) {
		t.Fatalf("%v does not match outbox.ErrInvalidPartitionCount", err)
	}
}
