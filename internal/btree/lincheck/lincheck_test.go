package lincheck

import (
	"math"
	"testing"

	"github.com/anishathalye/porcupine"
)

// op is a history entry for the table below: client c, [call, ret].
func op(c int, call, ret int64, in In, out Out) porcupine.Operation {
	return porcupine.Operation{ClientId: c, Call: call, Return: ret, Input: in, Output: out}
}

// TestModelTeeth: the model accepts linearizable histories and rejects, for
// each kind of operation, a history that is not (the oracle can fail).
func TestModelTeeth(t *testing.T) {
	put := func(k, v string) In { return In{Kind: "put", Key: k, Val: v} }
	get := func(k string) In { return In{Kind: "get", Key: k} }
	acked := Out{Applied: true, NoPrev: true}
	cases := []struct {
		name string
		ok   bool
		ops  []porcupine.Operation
	}{
		{"read after write", true, []porcupine.Operation{
			op(0, 0, 10, put("a", "1"), acked),
			op(1, 20, 30, get("a"), Out{Found: true, Val: "1"})}},
		{"stale read after an acknowledged write", false, []porcupine.Operation{
			op(0, 0, 10, put("a", "1"), acked),
			op(0, 11, 19, put("a", "2"), acked),
			op(1, 20, 30, get("a"), Out{Found: true, Val: "1"})}},
		{"lost write", false, []porcupine.Operation{
			op(0, 0, 10, put("a", "1"), acked),
			op(1, 20, 30, get("a"), Out{})}},
		{"a write of unknown outcome may land late", true, []porcupine.Operation{
			op(0, 0, math.MaxInt64, put("a", "1"), Out{Unknown: true}),
			op(1, 20, 30, get("a"), Out{}),
			op(1, 40, 50, get("a"), Out{Found: true, Val: "1"})}},
		{"...but not flicker", false, []porcupine.Operation{
			op(0, 0, math.MaxInt64, put("a", "1"), Out{Unknown: true}),
			op(1, 20, 30, get("a"), Out{Found: true, Val: "1"}),
			op(1, 40, 50, get("a"), Out{})}},
		{"a value nobody wrote (a write reported as not applied that was)", false, []porcupine.Operation{
			op(1, 20, 30, get("a"), Out{Found: true, Val: "1"})}},
		{"put-if-absent applied twice", false, []porcupine.Operation{
			op(0, 0, 10, In{Kind: "put", Key: "a", Val: "1", Cond: IfAbsent}, Out{Applied: true, NoPrev: true}),
			op(1, 20, 30, In{Kind: "put", Key: "a", Val: "2", Cond: IfAbsent}, Out{Applied: true, NoPrev: true})}},
		{"compare-and-swap reports the wrong current value", false, []porcupine.Operation{
			op(0, 0, 10, put("a", "1"), acked),
			op(1, 20, 30, In{Kind: "put", Key: "a", Val: "3", Cond: IfEquals, Eq: "2"}, Out{Found: true, Prev: "9"})}},
		{"delete of a present key reports it absent", false, []porcupine.Operation{
			op(0, 0, 10, put("a", "1"), acked),
			op(1, 20, 30, In{Kind: "del", Key: "a"}, Out{NoPrev: true})}},
		{"scan page", true, []porcupine.Operation{
			op(0, 0, 10, put("a", "1"), acked),
			op(0, 11, 19, put("c", "3"), acked),
			op(1, 20, 30, In{Kind: "scan", Limit: 1}, Out{Keys: []string{"a"}, Vals: []string{"1"}, Lo: "", Hi: "b", More: true})}},
		{"scan page missing a key of its span", false, []porcupine.Operation{
			op(0, 0, 10, put("a", "1"), acked),
			op(0, 11, 19, put("c", "3"), acked),
			op(1, 20, 30, In{Kind: "scan"}, Out{Keys: []string{"a"}, Vals: []string{"1"}, HiInf: true})}},
		{"reverse scan out of order", false, []porcupine.Operation{
			op(0, 0, 10, put("a", "1"), acked),
			op(0, 11, 19, put("c", "3"), acked),
			op(1, 20, 30, In{Kind: "scan", Reverse: true}, Out{Keys: []string{"a", "c"}, Vals: []string{"1", "3"}, HiInf: true})}},
		{"count", false, []porcupine.Operation{
			op(0, 0, 10, put("a", "1"), acked),
			op(1, 20, 30, In{Kind: "count", From: "a", To: "b"}, Out{Count: 0})}},
	}
	for _, c := range cases {
		if got := porcupine.CheckOperations(Model, c.ops); got != c.ok {
			t.Errorf("%s: linearizable %v, want %v", c.name, got, c.ok)
		}
	}
}

// TestPointModel: the key-by-key check agrees with the whole one on point
// histories, and a history with a scan is checked whole.
func TestPointModel(t *testing.T) {
	acked := Out{Applied: true, NoPrev: true}
	good := []porcupine.Operation{
		op(0, 0, 10, In{Kind: "put", Key: "a", Val: "1"}, acked),
		op(1, 0, 10, In{Kind: "put", Key: "b", Val: "2"}, acked),
		op(0, 20, 30, In{Kind: "get", Key: "a"}, Out{Found: true, Val: "1"}),
		op(1, 20, 30, In{Kind: "get", Key: "b"}, Out{Found: true, Val: "2"}),
	}
	bad := append(append([]porcupine.Operation(nil), good...), op(2, 40, 50, In{Kind: "get", Key: "b"}, Out{}))
	if !porcupine.CheckOperations(PointModel, good) || porcupine.CheckOperations(PointModel, bad) {
		t.Fatal("the key-by-key check disagrees with the model")
	}
	scan := append(append([]porcupine.Operation(nil), good...), op(2, 40, 50, In{Kind: "scan"}, Out{Keys: []string{"a"}, Vals: []string{"1"}, HiInf: true}))
	if porcupine.CheckOperations(PointModel, scan) {
		t.Fatal("a scan missing a key passed the point model")
	}
	if parts := PointModel.Partition(good); len(parts) != 2 {
		t.Fatalf("%d partitions of two keys", len(parts))
	}
}
