package llamaopt

import (
	"errors"
	"strings"
	"testing"

	"github.com/hydra-engine/hydra-engine/iface"
)

// cache_ram is llama-server's --cache-ram: MiB, 0 off (the plugin's
// default), -1 no limit; anything else is refused.
func TestCacheRAMOption(t *testing.T) {
	if o, err := Parse(nil); err != nil || o.CacheRAM != 0 {
		t.Fatalf("default cache_ram %d, %v", o.CacheRAM, err)
	}
	for v, want := range map[string]int64{"8192": 8192, " 0 ": 0, "-1": -1, "4294967296": maxCacheRAM} {
		if o, err := Parse(map[string]string{OptCacheRAM: v}); err != nil || o.CacheRAM != want {
			t.Errorf("cache_ram=%q: %d, %v; want %d", v, o.CacheRAM, err, want)
		}
	}
	for _, v := range []string{"-2", "lots", "1.5", "4294967297", ""} {
		if _, err := Parse(map[string]string{OptCacheRAM: v}); !errors.Is(err, iface.ErrBadRequest) || !strings.Contains(err.Error(), OptCacheRAM) {
			t.Errorf("cache_ram=%q: %v, want a bad request naming the option", v, err)
		}
	}
}
