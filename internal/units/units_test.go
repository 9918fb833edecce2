package units

import "testing"

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"4096": 4096, "8GiB": 8 << 30, "8G": 8 << 30, "8gib": 8 << 30, "1.5MiB": 3 << 19,
		"2 MB": 2e6, "4K": 4096, "0": 0, "7B": 7} {
		got, err := ParseSize(in)
		if err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "GiB", "-1", "1.5", "x8", "1e40"} {
		if _, err := ParseSize(bad); err == nil {
			t.Errorf("ParseSize(%q) accepted", bad)
		}
	}
	for n, want := range map[int64]string{0: "0 B", 512: "512 B", 8 << 30: "8 GiB", 3 << 19: "1.50 MiB", 100 << 20: "100 MiB"} {
		if got := FormatSize(n); got != want {
			t.Errorf("FormatSize(%d) = %q, want %q", n, got, want)
		}
	}
}
