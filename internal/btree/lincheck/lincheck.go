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

// entry is one "k=v" of an encoded state: the key, the value and where the
// entry starts and ends in the string (end excludes the ';' after it).
type entry struct {
	k, v       string
	start, end int
}

// entries walks an encoded state in key order, calling f with each entry
// until f returns false. It allocates nothing: Step runs millions of times
// in a long search, and decoding the whole map into a Go map each time was
// most of its cost.
func entries(s string, f func(e entry) bool) {
	for i := 0; i < len(s); {
		j := strings.IndexByte(s[i:], ';')
		if j < 0 {
			j = len(s)
		} else {
			j += i
		}
		kv := s[i:j]
		eq := strings.IndexByte(kv, '=')
		if !f(entry{kv[:eq], kv[eq+1:], i, j}) {
			return
		}
		i = j + 1
	}
}

// lookup finds key in an encoded state: its entry if found, else where an
// entry for it would go (start: the offset of the first greater entry, or
// len(s)).
func lookup(s, key string) (e entry, found bool) {
	e = entry{start: len(s), end: len(s)}
	entries(s, func(x entry) bool {
		if x.k < key {
			return true
		}
		if x.k == key {
			e, found = x, true
		} else {
			e = entry{start: x.start, end: x.start}
		}
		return false
	})
	return e, found
}

// withKey returns s with key set to v (at e, lookup's answer for key).
func withKey(s string, e entry, found bool, key, v string) string {
	kv := key + "=" + v
	switch {
	case found:
		return s[:e.start] + kv + s[e.end:]
	case s == "":
		return kv
	case e.start == len(s):
		return s + ";" + kv
	}
	return s[:e.start] + kv + ";" + s[e.start:]
}

// withoutKey returns s without the entry e.
func withoutKey(s string, e entry) string {
	switch {
	case e.start == 0 && e.end == len(s):
		return ""
	case e.end == len(s):
		return s[:e.start-1]
	}
	return s[:e.start] + s[e.end+1:]
}

// Model is the porcupine model of one tree. Keys and values must not
// contain '=' or ';'. Its state is the map encoded as "k=v;k=v" in key
// order (porcupine compares states with ==).
var Model = porcupine.Model{
	Init: func() interface{} { return "" },
	Step: func(state, input, output interface{}) (bool, interface{}) {
		s := state.(string)
		in, out := input.(In), output.(Out)
		switch in.Kind {
		case "get":
			e, found := lookup(s, in.Key)
			return out.Found == found && (!found || out.Val == e.v), state
		case "put", "del":
			e, found := lookup(s, in.Key)
			cur := e.v
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
					return true, withKey(s, e, found, in.Key, in.Val)
				}
				if !found {
					return true, state // (a delete if absent: nothing to remove)
				}
				return true, withoutKey(s, e)
			}
			return true, state
		case "count":
			n := 0
			entries(s, func(e entry) bool {
				if inSpan(e.k, in.From, in.To) {
					n++
				}
				return in.To == "" || e.k < in.To
			})
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
			if in.Limit > 0 && len(out.Keys) > in.Limit || len(out.Vals) != len(out.Keys) {
				return false, state
			}
			// The entries of [Lo, Hi) in key order, matched against the
			// page from its front (or its back, for a reverse page).
			n, ok := 0, true
			entries(s, func(e entry) bool {
				if e.k < out.Lo {
					return true
				}
				if !out.HiInf && e.k >= out.Hi {
					return false
				}
				i := n
				if in.Reverse {
					i = len(out.Keys) - 1 - n
				}
				if n >= len(out.Keys) || out.Keys[i] != e.k || out.Vals[i] != e.v {
					ok = false
					return false
				}
				n++
				return true
			})
			return ok && n == len(out.Keys), state
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

// Check checks a history against model within budget, first without the
// writes of unknown outcome whose value nobody saw, then, unless that
// passed, whole.
//
// Why the first pass is sound: a write of unknown outcome is recorded with
// an open end, so porcupine may place it after every other operation,
// where it changes nothing anyone saw. Any linearization of the history
// without it is therefore one of the history with it: Ok on the pruned
// history is Ok on the whole. The converse fails only where a dropped
// write's effect was relied on without its value being seen (a key's
// existence in a count, a condition), so a pruned history that does not
// pass is checked whole before anything is reported. Why it pays: each
// write of unknown outcome stays open to the end of the history, and the
// search tries it at every step; 18 of them in a 273-operation tree
// history took porcupine past 90 s (the fault suite, 2026-12-02), and most
// were never observed (a value never read back).
func Check(model porcupine.Model, ops []porcupine.Operation, budget time.Duration) (porcupine.CheckResult, porcupine.LinearizationInfo) {
	start := time.Now()
	if pruned := PruneUnseen(ops); len(pruned) < len(ops) {
		r, info := porcupine.CheckOperationsVerbose(model, pruned, budget)
		if r != porcupine.Illegal {
			// Ok stands for the whole; a time-out on the smaller history
			// would only time out again on the whole.
			return r, info
		}
	}
	return porcupine.CheckOperationsVerbose(model, ops, max(budget-time.Since(start), budget/2))
}

// PruneUnseen returns ops without the puts of unknown outcome whose value
// no operation saw (no get, scan or write's answer reported it, and no
// condition named it). Deletes of unknown outcome stay: what they leave
// (an absent key) has no value to look for.
func PruneUnseen(ops []porcupine.Operation) []porcupine.Operation {
	seen := map[string]bool{}
	for _, o := range ops {
		in, out := o.Input.(In), o.Output.(Out)
		if in.Cond == IfEquals {
			seen[in.Key+"="+in.Eq] = true
		}
		switch in.Kind {
		case "get":
			if out.Found {
				seen[in.Key+"="+out.Val] = true
			}
		case "put", "del":
			if !out.Unknown && !out.NoPrev && out.Found && !out.FoundOnly {
				seen[in.Key+"="+out.Prev] = true
			}
		case "scan":
			for i, k := range out.Keys {
				if i < len(out.Vals) {
					seen[k+"="+out.Vals[i]] = true
				}
			}
		}
	}
	kept := make([]porcupine.Operation, 0, len(ops))
	for _, o := range ops {
		in, out := o.Input.(In), o.Output.(Out)
		// Only an open-ended one (Return MaxInt64) may be placed last: an
		// unknown put with an end must take effect before it if it can.
		if out.Unknown && o.Return == math.MaxInt64 && in.Kind == "put" && !seen[in.Key+"="+in.Val] {
			continue
		}
		kept = append(kept, o)
	}
	return kept
}

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
