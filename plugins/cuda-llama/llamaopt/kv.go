package llamaopt

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

// KVOptions are the parsed KV options; the zero value is the default.
type KVOptions struct {
	KVSplit      bool // kv_unified=false
	ContextShift bool
	SWAFull      bool
}

// kvOptions are the options of this file, in the table.
var kvOptions = []option{
	{key: OptKVUnified, def: "true", doc: "true: one KV pool every slot uses; false: n_ctx/slots cells a slot, as llama-server without --kv-unified",
		parse: func(o *Options, key, v string) error {
			b, err := iface.ParseBoolOption(key, v)
			o.KVSplit = !b
			return err
		}},
	{key: OptSWAFull, def: "false", doc: "a sliding-window model's window caches keep every position (llama-server's --swa-full)",
		parse: func(o *Options, key, v string) error {
			b, err := iface.ParseBoolOption(key, v)
			o.SWAFull = b
			return err
		}},
	{key: OptContextShift, def: "false", doc: "a full slot drops the older half of its sequence after n_keep and goes on (llama-server's --context-shift)",
		parse: func(o *Options, key, v string) error {
			b, err := iface.ParseBoolOption(key, v)
			o.ContextShift = b
			return err
		}},
}
