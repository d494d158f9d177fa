package tests

import (
	"fmt"
	"os"
	"testing"

	"github.com/hydra-engine/hydra-engine/transport"
)

// BenchmarkStateTrailer: mock STATE_GET and STATE_PUT through a real engine
// (shm plane, the default 2 MiB chunk), with the integrity trailer (the
// default: summed as the state streams out, checked as it streams in) and
// without (STATE_GET's blob_trailer false; the PUT of that blob), side by
// side in one run, TCP and Unix. HYDRA_BENCH_KV sets kv_bytes_per_token
// (default 32768: a ~300 MB state).
//
//	go test ./tests/ -run '^$' -bench StateTrailer -benchtime 5x
func BenchmarkStateTrailer(b *testing.B) {
	kv := "32768"
	if v := os.Getenv("HYDRA_BENCH_KV"); v != "" {
		kv = v
	}
	e := startEngine(b, "--backend-opt", "kv_bytes_per_token="+kv, "--data-plane", "shm")
	c := client(b, e.unix)
	mustOK(b, c, transport.OpPrefill, "0", chat(string(make([]byte, 9000))))
	_, withT := mustOK(b, c, transport.OpStateGet, "0", nil)
	_, plain := mustOK(b, c, transport.OpStateGet, "0", []byte(`{"blob_trailer":false}`))
	for _, tr := range []string{"unix", "tcp"} {
		url := e.unix
		if tr == "tcp" {
			url = e.tcp
		}
		c := client(b, url)
		for _, v := range []struct {
			name string
			get  []byte
			put  []byte
		}{{"trailer", nil, withT}, {"none", []byte(`{"blob_trailer":false}`), plain}} {
			b.Run(fmt.Sprintf("%s/get/%s", tr, v.name), func(b *testing.B) {
				b.SetBytes(int64(len(v.put)))
				for b.Loop() {
					mustOK(b, c, transport.OpStateGet, "0", v.get)
				}
			})
			b.Run(fmt.Sprintf("%s/put/%s", tr, v.name), func(b *testing.B) {
				b.SetBytes(int64(len(v.put)))
				for b.Loop() {
					mustOK(b, c, transport.OpStatePut, "1", v.put)
				}
			})
		}
	}
}
