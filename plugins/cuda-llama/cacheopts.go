package cudallama

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

// cacheOptions are the parsed prompt cache options; the zero value keeps
// no cache.
type cacheOptions struct {
	cacheRAM int64 // MiB; -1: no limit; 0: off
}

// cacheParsers are the options of this file, merged into optionParsers.
var cacheParsers = map[string]optionParser{
	OptCacheRAM: func(o *options, key, v string) error {
		n, err := iface.ParseIntOption(key, v, -1, maxCacheRAM)
		o.cacheRAM = int64(n)
		return err
	},
}
