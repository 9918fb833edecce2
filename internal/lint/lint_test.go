// Package lint holds style rules enforced by tests. The rule here: protocol
// cores stay free of I/O, so that the simulator can drive them in virtual
// time and replay any seed. A core reads time only from its arguments and
// talks only through returned messages.
package lint

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"testing"
)

// cores are the files that must stay pure.
var cores = []string{
	"fd/fd.go", "fd/wire.go", "fd/engine.go", "fd/clockguard.go",
	"lock/lock.go", "lock/master.go", "lock/clerk.go", "lock/wire.go", "lock/engine.go", "lock/state.go", "lock/token.go",
	"meta/fsm.go",
	"rldev/engine.go", "rldev/replica.go", "rldev/datapath.go", "rldev/resync.go", "rldev/scrub.go", "rldev/pagelog.go",
	"rldev/rangelock.go", "rldev/move.go", "rldev/meta.go", "rldev/format.go", "rldev/table.go", "rldev/msgs.go", "rldev/wire.go",
	"chunk/manager.go", "chunk/chunkmap.go", "chunk/chunkio.go", "chunk/format.go", "chunk/handle.go", "chunk/space.go",
	"chunk/table.go", "chunk/wire.go",
	"txn/format.go", "txn/scan.go", "treecall/treecall.go",
	"ddstable/dpmap.go", "ddstable/maps.go", "ddstable/reshape.go", "ddstable/rebalance.go", "ddstable/checkpoint.go", "ddstable/participant.go", "ddstable/coordinator.go",
	"btree/node.go", "btree/delta.go", "btree/anchor.go", "btree/store.go", "btree/tree.go", "btree/compress.go", "btree/scan.go", "btree/walk.go", "btree/completion.go",
}

// banned calls (package.Func) and imports inside a core.
var (
	bannedCalls = map[string]bool{
		"time.Now": true, "time.Sleep": true, "time.After": true, "time.Tick": true,
		"time.NewTimer": true, "time.NewTicker": true, "time.AfterFunc": true, "time.Since": true, "time.Until": true,
	}
	bannedImports = map[string]bool{
		"net": true, "os": true, "math/rand": true, "math/rand/v2": true, "crypto/rand": true,
		"google.golang.org/grpc": true, "syscall": true,
	}
)

func TestProtocolCoresHaveNoIO(t *testing.T) {
	// go test runs a package's tests in its directory: internal/lint. (Not
	// runtime.Caller's file name: under -trimpath, as scripts/test.sh
	// builds, that is an import path, not a place on disk.)
	root := ".."
	fset := token.NewFileSet()
	for _, rel := range cores {
		f, err := parser.ParseFile(fset, filepath.Join(root, rel), nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if bannedImports[p] {
				t.Errorf("%s imports %q: protocol cores do no I/O", rel, p)
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch x := n.(type) {
			case *ast.GoStmt:
				t.Errorf("%s: a go statement at %v: protocol cores start no goroutines", rel, fset.Position(x.Pos()))
			case *ast.CallExpr:
				if sel, ok := x.Fun.(*ast.SelectorExpr); ok {
					if id, ok := sel.X.(*ast.Ident); ok && bannedCalls[id.Name+"."+sel.Sel.Name] {
						t.Errorf("%s: %s.%s at %v: protocol cores take time as an argument", rel, id.Name, sel.Sel.Name, fset.Position(x.Pos()))
					}
				}
			}
			return true
		})
	}
}
