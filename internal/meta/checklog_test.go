package meta

import (
	"errors"
	"strings"
	"testing"

	"github.com/hashicorp/raft"
)

// brokenLog fails GetLog at one index, as raft-wal before v0.4.2 did for
// every entry of a sealed segment a truncation left without its index
// block.
type brokenLog struct {
	*raft.InmemStore
	bad uint64
}

func (b brokenLog) GetLog(i uint64, l *raft.Log) error {
	if i == b.bad {
		return errors.New("sealed segment has no index block")
	}
	return b.InmemStore.GetLog(i, l)
}

// TestCheckLogNamesTheWayBack: a log with an unreadable entry is refused at
// start with ErrLogDamaged and the procedure that brings the replica back
// (raft.NewRaft panicked on it: the process died with a stack and no
// advice); a sound log, and an empty one, pass.
func TestCheckLogNamesTheWayBack(t *testing.T) {
	mem := raft.NewInmemStore()
	if err := checkLog(mem); err != nil {
		t.Fatalf("empty log: %v", err)
	}
	var logs []*raft.Log
	for i := uint64(5); i <= 40; i++ {
		logs = append(logs, &raft.Log{Index: i, Term: 1, Type: raft.LogCommand, Data: []byte{byte(i)}})
	}
	if err := mem.StoreLogs(logs); err != nil {
		t.Fatal(err)
	}
	if err := checkLog(mem); err != nil {
		t.Fatalf("sound log: %v", err)
	}
	err := checkLog(brokenLog{InmemStore: mem, bad: 33})
	if !errors.Is(err, ErrLogDamaged) {
		t.Fatalf("damaged log: %v, want ErrLogDamaged", err)
	}
	for _, want := range []string{"entry 33 of 5..40", "no index block", "grove member remove", "grove member add"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error %q does not say %q", err, want)
		}
	}
}
