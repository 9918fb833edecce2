// Package blockcheck is the independent oracle of RLDev block histories: a
// porcupine model of one block as a register of unique write values (0:
// never written). The RLDev simulator (package rldev's tests) and the
// real-process test of `grove up` (cmd/grove) record each block's history
// in its terms and check it with Check.
//
// A write whose outcome is unknown (it failed saying it may have taken
// effect, or went unanswered) is recorded with Return = Open: it may take
// effect at any time after its call.
package blockcheck

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// In is an operation's input: a write of V, or a read (its output is the
// value read, a uint64).
type In struct {
	Write bool
	V     uint64
}

// Open is the Return of an operation of unknown outcome.
const Open = math.MaxInt64

// Model is a block as a register.
var Model = porcupine.Model{
	Init: func() any { return uint64(0) },
	Step: func(state, input, output any) (bool, any) {
		if in := input.(In); in.Write {
			return true, in.V
		}
		return output.(uint64) == state.(uint64), state
	},
	DescribeOperation: func(input, output any) string {
		if in := input.(In); in.Write {
			return fmt.Sprintf("write(%d)", in.V)
		}
		return fmt.Sprintf("read() -> %v", output)
	},
}

// Observed drops the writes of unknown outcome whose value no read
// returned: such a write can always be placed after every other
// operation, so it does not change the verdict, and each one left in
// multiplies the checker's search.
func Observed(h []porcupine.Operation) []porcupine.Operation {
	seen := map[uint64]bool{}
	for _, op := range h {
		if in := op.Input.(In); !in.Write {
			seen[op.Output.(uint64)] = true
		}
	}
	var out []porcupine.Operation
	for _, op := range h {
		if in := op.Input.(In); in.Write && op.Return == Open && !seen[in.V] {
			continue
		}
		out = append(out, op)
	}
	return out
}

// Check checks one block's history (Observed first) within timeout:
// porcupine.Ok, Illegal or Unknown (timed out).
func Check(h []porcupine.Operation, timeout time.Duration) porcupine.CheckResult {
	return porcupine.CheckOperationsTimeout(Model, Observed(h), timeout)
}

// Describe lists a history in call order, one operation a line (times in
// seconds of the history's clock, Metadata as "from ...": where the
// operation was served).
func Describe(h []porcupine.Operation) string {
	ops := append([]porcupine.Operation{}, h...)
	sort.Slice(ops, func(i, j int) bool { return ops[i].Call < ops[j].Call })
	var b strings.Builder
	for _, op := range ops {
		ret := "open"
		if op.Return != Open {
			ret = fmt.Sprintf("%.3fs", time.Duration(op.Return).Seconds())
		}
		fmt.Fprintf(&b, "\n    client %d [%.3fs, %s] %s", op.ClientId, time.Duration(op.Call).Seconds(), ret, Model.DescribeOperation(op.Input, op.Output))
		if op.Metadata != nil {
			fmt.Fprintf(&b, " from %v", op.Metadata)
		}
	}
	return b.String()
}
