// Package lincheck is the independent oracle of B-tree histories: a
// porcupine model of one tree as a map from keys to values, with point
// reads, conditional puts and deletes, atomic scan pages and counts. The
// B-tree simulator (package btree's tests) and the real-process test of
// `grove up` (cmd/grove) record their histories in its terms.
//
// It shares no code with the tree: conditions, spans and pages are
// re-stated here from the API's documentation, so that a defect in the
// tree's own reading of them is not also the oracle's.
package lincheck

import (
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
)

// Cond is a write's condition on the key's current value.
type Cond int

const (
	Always   Cond = iota // no condition (a delete: the key must exist to be applied)
	IfAbsent             // the key is absent
	IfEquals             // the key is present with value Eq
	IfExists             // the key is present
)

// holds says whether c holds on the key's current state.
func (c Cond) holds(found bool, cur, eq string) bool {
	switch c {
	case IfAbsent:
		return !found
	case IfEquals:
		return found && cur == eq
	case IfExists:
		return found
	}
	return true
}

// In is an operation's request.
type In struct {
	Kind    string // get put del scan count
	Key     string
	Val     string
	Cond    Cond
	Eq      string
	From    string // scan, count: the span [From, To)
	To      string // "": no end
	Limit   int    // scan: at most this many entries (0: no limit)
	Reverse bool
}

// Out is an operation's answer.
type Out struct {
	// Unknown: a write whose outcome is unknown (it failed in a way that
	// does not say whether it took effect). Record it with an open end
	// (Return math.MaxInt64): it may take effect at any later time.
	Unknown bool
	Applied bool // put, del: the condition held and the write is done
	// NoPrev: the answer does not say what the write found (Found and
	// Prev are not checked).
	NoPrev bool
	// FoundOnly: the answer says whether the write found the key, not its
	// value (a tokened write answered from its completion record).
	FoundOnly bool
	Found     bool   // put, del: the key was present; get: found
	Prev      string // put, del: its value then
	Val       string // get
	Count     int
	// A scan page: exactly the entries in [Lo, Hi) (Hi infinite if
	// HiInf), within the span, in order, at most Limit of them; More
	// false means the page is the whole span.
	Keys, Vals []string
	Lo, Hi     string
	HiInf      bool
	More       bool
}

func inSpan(k, from, to string) bool { return k >= from && (to == "" || k < to) }

// The state is the map encoded as "k=v;k=v" in key order: porcupine
// compares states with ==.
func decodeState(s string) map[string]string {
	m := map[string]string{}
	if s == "" {
		return m
	}
	for _, kv := range strings.Split(s, ";") {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return m
}

func encodeState(m map[string]string) string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	var b strings.Builder
	for i, k := range ks {
		if i > 0 {
			b.WriteByte(';')
		}
		b.WriteString(k + "=" + m[k])
	}
	return b.String()
}

// Model is the porcupine model of one tree. Keys and values must not
// contain '=' or ';'.
var Model = porcupine.Model{
	Init: func() interface{} { return "" },
	Step: func(state, input, output interface{}) (bool, interface{}) {
		st := decodeState(state.(string))
		in, out := input.(In), output.(Out)
		cur, found := st[in.Key]
		switch in.Kind {
		case "get":
			return out.Found == found && (!found || out.Val == cur), state
		case "put", "del":
			c := in.Cond
			if in.Kind == "del" && c == Always {
				c = IfExists
			}
			holds := c.holds(found, cur, in.Eq)
			if !out.Unknown && (out.Applied != holds || !out.NoPrev && (out.Found != found || found && !out.FoundOnly && out.Prev != cur)) {
				return false, state
			}
			if holds {
				if in.Kind == "put" {
					st[in.Key] = in.Val
				} else {
					delete(st, in.Key)
				}
				return true, encodeState(st)
			}
			return true, state
		case "count":
			n := 0
			for k := range st {
				if inSpan(k, in.From, in.To) {
					n++
				}
			}
			return out.Count == n, state
		case "scan":
			// The page holds exactly the entries in [Lo, Hi), within the
			// span, no more than the limit, and all of the span if !More.
			if out.Lo < in.From || in.To != "" && (out.HiInf || out.Hi > in.To) {
				return false, state
			}
			if !out.More && (out.Lo != in.From || out.HiInf != (in.To == "") || !out.HiInf && out.Hi != in.To) {
				return false, state
			}
			var ks []string
			for k := range st {
				if k >= out.Lo && (out.HiInf || k < out.Hi) {
					ks = append(ks, k)
				}
			}
			sort.Strings(ks)
			if in.Reverse {
				sort.Sort(sort.Reverse(sort.StringSlice(ks)))
			}
			if len(ks) != len(out.Keys) || in.Limit > 0 && len(out.Keys) > in.Limit {
				return false, state
			}
			for i, k := range ks {
				if out.Keys[i] != k || out.Vals[i] != st[k] {
					return false, state
				}
			}
			return true, state
		}
		panic("lincheck: unknown operation " + in.Kind)
	},
	DescribeOperation: func(input, output interface{}) string {
		in, out := input.(In), output.(Out)
		switch in.Kind {
		case "get":
			return fmt.Sprintf("get(%s) -> %v %q", in.Key, out.Found, out.Val)
		case "put", "del":
			return fmt.Sprintf("%s(%s, %q, cond %d %q) -> unknown %v applied %v found %v prev %q (reported: %v)", in.Kind, in.Key, in.Val, in.Cond, in.Eq, out.Unknown, out.Applied, out.Found, out.Prev, !out.NoPrev)
		case "count":
			return fmt.Sprintf("count[%s,%s) -> %d", in.From, in.To, out.Count)
		}
		return fmt.Sprintf("scan[%s,%s) lim %d rev %v -> [%s,%s inf %v) more %v %v", in.From, in.To, in.Limit, in.Reverse, out.Lo, out.Hi, out.HiInf, out.More, out.Keys)
	},
}

// PointModel is Model for histories of point operations only (get, put,
// del): they are checked key by key, which keeps many writes of unknown
// outcome affordable. A history with a scan or count is checked whole.
var PointModel = func() porcupine.Model {
	m := Model
	m.Partition = func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		var keys []string
		for _, o := range history {
			in := o.Input.(In)
			if in.Kind == "scan" || in.Kind == "count" {
				return [][]porcupine.Operation{history}
			}
			if _, ok := byKey[in.Key]; !ok {
				keys = append(keys, in.Key)
			}
			byKey[in.Key] = append(byKey[in.Key], o)
		}
		sort.Strings(keys)
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, byKey[k])
		}
		return out
	}
	return m
}()

// History collects operations from concurrent clients.
type History struct {
	mu  sync.Mutex
	ops []porcupine.Operation
}

// Add records one operation; an unknown write's ret is math.MaxInt64.
func (h *History) Add(client int, in In, out Out, call, ret int64, meta ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ops = append(h.ops, porcupine.Operation{ClientId: client, Input: in, Output: out, Call: call, Return: ret, Metadata: fmt.Sprint(meta...)})
}

// Ops returns the operations recorded so far (a copy of the slice).
func (h *History) Ops() []porcupine.Operation {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]porcupine.Operation(nil), h.ops...)
}

// Unknown counts the writes of unknown outcome in ops.
func Unknown(ops []porcupine.Operation) int {
	n := 0
	for _, o := range ops {
		if o.Output.(Out).Unknown {
			n++
		}
	}
	return n
}

// Dump writes ops in order of call, one line each (times in µs), for a
// failed history.
func Dump(w io.Writer, ops []porcupine.Operation) {
	sorted := append([]porcupine.Operation(nil), ops...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Call < sorted[j].Call })
	for _, o := range sorted {
		ret := "inf"
		if o.Return != math.MaxInt64 {
			ret = fmt.Sprint(o.Return / 1000)
		}
		fmt.Fprintf(w, "c%d [%d, %s] %s (%v)\n", o.ClientId, o.Call/1000, ret, Model.DescribeOperation(o.Input, o.Output), o.Metadata)
	}
}

// Explain narrows a failed history down for a person: which keys' own
// histories fail (scans and counts left out), and the first prefix in order
// of call that fails. Each check is bounded by per.
func Explain(ops []porcupine.Operation, per time.Duration) []string {
	var lines []string
	byKey := map[string][]porcupine.Operation{}
	for _, o := range ops {
		in := o.Input.(In)
		if in.Kind == "scan" || in.Kind == "count" {
			continue
		}
		byKey[in.Key] = append(byKey[in.Key], o)
	}
	keys := make([]string, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if r := porcupine.CheckOperationsTimeout(Model, byKey[k], per); r != porcupine.Ok {
			lines = append(lines, fmt.Sprintf("key %s alone: %v", k, r))
		}
	}
	sorted := append([]porcupine.Operation(nil), ops...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Call < sorted[j].Call })
	// The shortest failing prefix, by bisection (a prefix of a
	// linearizable history is linearizable, bar open-ended writes).
	lo, hi := 0, len(sorted)
	if porcupine.CheckOperationsTimeout(Model, sorted, per) == porcupine.Ok {
		return lines
	}
	for lo+1 < hi {
		mid := (lo + hi) / 2
		if porcupine.CheckOperationsTimeout(Model, sorted[:mid], per) == porcupine.Ok {
			lo = mid
		} else {
			hi = mid
		}
	}
	o := sorted[hi-1]
	lines = append(lines, fmt.Sprintf("the first failing prefix ends with operation %d: c%d %s [%d,%d] (%v)", hi-1, o.ClientId, Model.DescribeOperation(o.Input, o.Output), o.Call/1000, o.Return/1000, o.Metadata))
	return lines
}

// WriteFailure writes a failed history to path: the operations in order of
// call, then extra lines (a run's events), then the visualization beside
// it (path + ".html").
func WriteFailure(path string, ops []porcupine.Operation, info porcupine.LinearizationInfo, extra []string) error {
	var b strings.Builder
	Dump(&b, ops)
	for _, e := range extra {
		b.WriteString(e + "\n")
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return err
	}
	f, err := os.Create(path + ".html")
	if err != nil {
		return err
	}
	defer f.Close()
	return porcupine.Visualize(Model, info, f)
}
