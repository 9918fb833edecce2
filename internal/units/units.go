// Package units parses and prints byte sizes the way operators write them:
// "8GiB", "512MiB", "4K", "1.5TB", "4096".
package units

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

var suffixes = []struct {
	s string
	n float64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
	{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
	// A bare letter is binary, as dd and fio read it.
	{"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"T", 1 << 40},
	{"B", 1},
}

// ParseSize reads a byte size: a number with an optional unit (KiB, MiB,
// GiB, TiB; KB, MB, GB, TB; K, M, G, T as binary; B). Case matters for
// nothing but the i.
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	mult := 1.0
	for _, x := range suffixes {
		if len(t) > len(x.s) && strings.EqualFold(t[len(t)-len(x.s):], x.s) {
			t, mult = strings.TrimSpace(t[:len(t)-len(x.s)]), x.n
			break
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || v < 0 || math.IsInf(v, 0) || math.IsNaN(v) {
		return 0, fmt.Errorf("%q is not a size (examples: 8GiB, 512MiB, 4096)", s)
	}
	n := v * mult
	if n > math.MaxInt64/2 {
		return 0, fmt.Errorf("%q is too large", s)
	}
	if n != math.Trunc(n) {
		return 0, fmt.Errorf("%q is not a whole number of bytes", s)
	}
	return int64(n), nil
}

// FormatSize prints n bytes with a binary unit, to three significant
// digits ("8 GiB", "1.50 MiB", "512 B").
func FormatSize(n int64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB"}
	v := float64(n)
	i := 0
	for v >= 1024 && i < len(units)-1 {
		v /= 1024
		i++
	}
	switch {
	case i == 0 || v == math.Trunc(v):
		return fmt.Sprintf("%.0f %s", v, units[i])
	case v < 10:
		return fmt.Sprintf("%.2f %s", v, units[i])
	case v < 100:
		return fmt.Sprintf("%.1f %s", v, units[i])
	}
	return fmt.Sprintf("%.0f %s", v, units[i])
}

// Size is a byte size in a config file or flag ("8GiB").
type Size int64

func (s *Size) UnmarshalText(b []byte) error {
	v, err := ParseSize(string(b))
	*s = Size(v)
	return err
}

func (s Size) MarshalText() ([]byte, error) { return []byte(strconv.FormatInt(int64(s), 10)), nil }

// String is for flags.
func (s Size) String() string { return FormatSize(int64(s)) }

// Set is for flags (pflag.Value).
func (s *Size) Set(v string) error { return s.UnmarshalText([]byte(v)) }

// Type is for flags (pflag.Value).
func (s *Size) Type() string { return "size" }
