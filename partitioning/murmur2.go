package partitioning

// Murmur2 is the default [Partitioner]. It places keys as Kafka's default
// partitioner does: toPositive(murmur2(key)) % partitions. The zero value is
// ready to use and it is safe for concurrent use.
type Murmur2 struct{}

// Partition returns (Murmur2Hash(key) & 0x7fffffff) % partitions. It does not
// allocate on success.
func (Murmur2) Partition(key string, partitions int) (int, error) {
	if err := ValidatePartitions(partitions); err != nil {
		return 0, err
	}
	return int(murmur2(key)&0x7fffffff) % partitions, nil
}

// Murmur2Hash returns Kafka's murmur2 hash of data (MurmurHash2, seed
// 0x9747b28c), as the Java client's Utils.murmur2 returns it: a signed 32-bit
// value.
func Murmur2Hash(data []byte) int32 {
	return int32(murmur2(data))
}

// murmur2 is Kafka's MurmurHash2 over the bytes of b. It is generic so that
// strings are hashed in place, without a copy to []byte.
func murmur2[T string | []byte](b T) uint32 {
	const (
		seed uint32 = 0x9747b28c
		m    uint32 = 0x5bd1e995
		r           = 24
	)
	h := seed ^ uint32(len(b))
	for len(b) >= 4 {
		k := uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
		b = b[4:]
		k *= m
		k ^= k >> r
		k *= m

		h *= m
		h ^= k
	}
	switch len(b) {
	case 3:
		h ^= uint32(b[2]) << 16
		fallthrough
	case 2:
		h ^= uint32(b[1]) << 8
		fallthrough
	case 1:
		h ^= uint32(b[0])
		h *= m
	}
	h ^= h >> 13
	h *= m
	h ^= h >> 15
	return h
}
