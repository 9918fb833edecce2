package rldev

import (
	"math/rand"
	"testing"

	"github.com/grovestore/grove/internal/disk"
)

// Outside review 59: a process formats a new disk (FormatDisk) and its
// Sync fails, losing the header, which stays in the page cache; the
// process gives up (openDisks fails) and the next one starts. OpenDisk is
// the first read of the disk, before any DropCache: it finds the lost
// header, takes the disk as formatted, and the node runs (registers its
// UUID, places segments) on a header that a power cut then takes away;
// the next start formats a new UUID and the table takes every segment on
// the disk as lost with it (durably written data disowned).
func TestReview59OpenDiskTrustsALostHeader(t *testing.T) {
	dev := disk.NewMemDevice(8<<20, rand.New(rand.NewSource(1)))
	dev.SetFaults(disk.MemFaults{SyncLoses: 1})
	if _, _, err := OpenDisk(dev, 1, 0); err == nil {
		t.Fatal("setup: the header's Sync did not fail")
	}
	dev.SetFaults(disk.MemFaults{})
	// The next process.
	h, fresh, err := OpenDisk(dev, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	platter := dev.Platter(0, 2*PageSize)
	_, _, durable := NewestPage(platter[:PageSize], platter[PageSize:], PageDisk)
	t.Logf("second OpenDisk: uuid %s fresh %v; a header on the platter: %v", h.UUID, fresh, durable)
	if !fresh && !durable {
		t.Fatalf("OpenDisk took a header that no sync made durable (uuid %s): it read the page cache before any DropCache", h.UUID)
	}
}
