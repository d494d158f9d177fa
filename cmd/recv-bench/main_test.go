package main

import (
	"net"
	"os"
	"testing"
)

func TestParseVariant(t *testing.T) {
	for name, want := range map[string]variant{
		"serve":                {name: "serve"},
		"serve-seq":            {name: "serve-seq", seq: true},
		"ring-4x2048":          {name: "ring-4x2048", ring: true, slots: 4, slot: 2 << 20, deadline: true, msgs: true},
		"ring-2x512-heap-nodl": {name: "ring-2x512-heap-nodl", ring: true, slots: 2, slot: 512 << 10, heap: true, msgs: true},
		"hot-4x1024-nomsg":     {name: "hot-4x1024-nomsg", ring: true, hot: true, slots: 4, slot: 1 << 20, deadline: true},
	} {
		if got, err := parseVariant(name); err != nil || got != want {
			t.Errorf("%s: %+v, %v; want %+v", name, got, err, want)
		}
	}
	for _, bad := range []string{"", "raw", "ring", "ring-0x2048", "ring-4x", "ring-4x2048-fast", "hot-x"} {
		if _, err := parseVariant(bad); err == nil {
			t.Errorf("%q was accepted", bad)
		}
	}
}

// TestReceivers: every kind of receive loop takes a transfer whole, over a
// real socket, and the next one after it.
func TestReceivers(t *testing.T) {
	if _, err := os.Stat("/dev/shm"); err != nil {
		t.Skip("no /dev/shm")
	}
	for _, name := range []string{"serve", "serve-seq", "ring-3x64", "ring-3x64-heap-nodl-nomsg", "hot-2x300"} {
		v, _ := parseVariant(name)
		recv, err := v.receiver()
		if err != nil {
			t.Fatal(err)
		}
		a, b := net.Pipe()
		const size = 5<<20 + 123
		go func() {
			buf := make([]byte, 100_000)
			for range 2 {
				for rem := size; rem > 0; rem -= len(buf[:min(rem, len(buf))]) {
					a.Write(buf[:min(rem, len(buf))])
				}
			}
			a.Close()
		}()
		for i := range 2 {
			if err := recv(b, size); err != nil {
				t.Fatalf("%s, transfer %d: %v", name, i, err)
			}
		}
		b.Close()
	}
}

func TestMedian(t *testing.T) {
	if m := median([]float64{3, 1, 2}); m != 2 {
		t.Fatal(m)
	}
	if m := median([]float64{4, 1, 2, 3}); m != 2.5 {
		t.Fatal(m)
	}
}
