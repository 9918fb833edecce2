package blockcheck

import (
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

func w(c int, v uint64, call, ret int64) porcupine.Operation {
	return porcupine.Operation{ClientId: c, Input: In{Write: true, V: v}, Call: call, Return: ret}
}

func r(c int, v uint64, call, ret int64) porcupine.Operation {
	return porcupine.Operation{ClientId: c, Input: In{}, Output: v, Call: call, Return: ret, Metadata: "node 1"}
}

// TestCheck: a register's histories pass (an open write seen late, reads
// overlapping a write in either order, the initial zero); a stale read
// after an acknowledged write, and a value no write wrote, do not; open
// writes never read are dropped before the search.
func TestCheck(t *testing.T) {
	ok := []porcupine.Operation{r(3, 0, 0, 1), w(1, 1, 2, 10), w(2, 2, 20, Open), r(3, 1, 11, 12), r(3, 2, 40, 50), w(1, 3, 60, 80), r(3, 2, 61, 70), r(3, 3, 90, 95), w(2, 9, 96, Open)}
	if res := Check(ok, time.Second); res != porcupine.Ok {
		t.Fatalf("a register's history: %v%s", res, Describe(ok))
	}
	if n := len(Observed(ok)); n != len(ok)-1 {
		t.Fatalf("Observed kept %d of %d operations (one open write is never read)", n, len(ok))
	}
	stale := []porcupine.Operation{w(1, 1, 0, 10), w(1, 2, 20, 30), r(2, 1, 40, 45)}
	if res := Check(stale, time.Second); res != porcupine.Illegal {
		t.Fatalf("a stale read: %v", res)
	}
	never := []porcupine.Operation{w(1, 1, 0, 10), r(2, 7, 20, 25)}
	if res := Check(never, time.Second); res != porcupine.Illegal {
		t.Fatalf("a value no write wrote: %v", res)
	}
	if d := Describe(stale); !strings.Contains(d, "read() -> 1") || !strings.Contains(d, "from node 1") {
		t.Fatalf("Describe: %s", d)
	}
}
