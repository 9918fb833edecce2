package btree

import (
	"os"
	"sort"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// debugHistory finds which keys' single-key histories fail, and which
// scan breaks a passing prefix.
func debugHistory(t testing.TB, ops []porcupine.Operation) {
	if os.Getenv("GROVE_SIM_DUMP") == "" {
		return
	}
	byKey := map[string][]porcupine.Operation{}
	for _, o := range ops {
		in := o.Input.(kvIn)
		if in.kind == "scan" || in.kind == "count" {
			continue
		}
		byKey[in.key] = append(byKey[in.key], o)
	}
	for k, h := range byKey {
		if r := porcupine.CheckOperationsTimeout(kvModel, h, 10*time.Second); r != porcupine.Ok {
			t.Logf("key %s alone: %v", k, r)
		}
	}
	sorted := append([]porcupine.Operation(nil), ops...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Call < sorted[j].Call })
	for i := 1; i <= len(sorted); i++ {
		if r := porcupine.CheckOperationsTimeout(kvModel, sorted[:i], 10*time.Second); r != porcupine.Ok {
			t.Logf("the first failing prefix ends with op %d: %s [%d,%d]", i-1, kvModel.DescribeOperation(sorted[i-1].Input, sorted[i-1].Output), sorted[i-1].Call/1000, sorted[i-1].Return/1000)
			return
		}
	}
}
