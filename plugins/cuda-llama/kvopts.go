package cudallama

import "github.com/hydra-engine/hydra-engine/iface"

// Options of the KV cells' sharing between slots and of full slots.
const (
	// OptKVUnified: true (the default) lets every slot use any of the n_ctx
	// cells, shared; false gives each slot a KV stream of n_ctx / n_slots
	// cells of its own, as llama-server does without --kv-unified, so that a
	// sequence's attention spans its own cells only (the scratch sequence
	// takes one more share). States are one stream on the wire either way
	// (shim.cpp), so they move between engines of any slot count and mode.
	OptKVUnified = "kv_unified"
	// OptContextShift: a slot that fills its cells drops the older half of
	// its sequence after n_keep tokens and goes on, as llama-server's
	// --context-shift; off (the default), its decode stops with
	// n_tokens_limit.
	OptContextShift = "context_shift"
	// OptSWAFull: a sliding-window model keeps every position in its window
	// caches too (llama-server's --swa-full), at n_ctx cells per window
	// layer; off (the default, as llama-server's), a window cache holds the
	// window only, and a prompt reuses a cached prefix only where the window
	// before it is still held.
	OptSWAFull = "swa_full"
)

// kvOptions are the parsed KV options; the zero value is the default.
type kvOptions struct {
	kvSplit      bool // kv_unified=false
	contextShift bool
	swaFull      bool
}

// kvParsers are the options of this file, merged into optionParsers.
var kvParsers = map[string]optionParser{
	OptKVUnified: func(o *options, key, v string) error {
		b, err := iface.ParseBoolOption(key, v)
		o.kvSplit = !b
		return err
	},
	OptSWAFull: func(o *options, key, v string) error {
		b, err := iface.ParseBoolOption(key, v)
		o.swaFull = b
		return err
	},
	OptContextShift: func(o *options, key, v string) error {
		b, err := iface.ParseBoolOption(key, v)
		o.contextShift = b
		return err
	},
}
