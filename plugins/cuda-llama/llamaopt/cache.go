package llamaopt

import "github.com/hydra-engine/hydra-engine/iface"

// Options of the host-memory prompt cache (promptcache.go).
const (
	// OptCacheRAM is the prompt cache's budget in MiB, llama-server's
	// --cache-ram: HTTP completions' sequences that leave their slot for
	// another prompt are saved into host memory up to it, least recently
	// used out first, and a later prompt starts from the one it shares most
	// with. 0 (the plugin's default): no cache; -1: no limit in bytes (the
	// cached tokens are then bounded by n_ctx, as llama-server's).
	OptCacheRAM = "cache_ram"
	// maxCacheRAM is the largest budget taken, in MiB (4 PiB): any machine's
	// memory, far from overflowing a byte count.
	maxCacheRAM = 1 << 32
)

// CacheOptions are the parsed prompt cache options; the zero value keeps
// no cache.
type CacheOptions struct {
	CacheRAM int64 // MiB; -1: no limit; 0: off
}

// cacheOptions are the options of this file, in the table.
var cacheOptions = []option{
	{key: OptCacheRAM, def: "0", doc: "host-memory prompt cache in MiB (llama-server's --cache-ram): 0 off, -1 no byte limit",
		parse: func(o *Options, key, v string) error {
			n, err := iface.ParseIntOption(key, v, -1, maxCacheRAM)
			o.CacheRAM = int64(n)
			return err
		}},
}
