package cudallama

import (
	"encoding/binary"
	"fmt"
)

// firstPos is the first position a saved state of a sequence of n tokens
// holds, as llama.cpp's llama_memory_seq_pos_min says of it once restored:
// the latest of its parts' first positions. A sliding window's part holds
// only the window's cells, whatever its cache still kept when it was
// saved, and a recurrent part stands for the sequence's last token. The
// prompt cache judges an entry by it (promptcache.Rule.Keep), as cut judges
// a slot by the live sequence's.
func (l stateLayout) firstPos(state []byte, n int) (int, error) {
	first, off := -1, 0
	for i, p := range l.Parts {
		if p.Kind == partRecurrent {
			if n > 0 {
				first = max(first, n-1)
			}
			off += int(p.size(min(n, 1)))
			continue
		}
		if off+8 > len(state) {
			return -1, fmt.Errorf("state of %d bytes ends before part %d's cell count", len(state), i)
		}
		cells := int(binary.LittleEndian.Uint32(state[off+4:]))
		if cells == 0 {
			off += int(p.size(0))
			continue
		}
		if end := off + 8 + cells*int(p.CellMeta); end > len(state) || p.CellMeta < 4 {
			return -1, fmt.Errorf("part %d's %d cells end past the state's %d bytes", i, cells, len(state))
		}
		lo := -1
		for c := range cells {
			pos := int(int32(binary.LittleEndian.Uint32(state[off+8+c*int(p.CellMeta):])))
			if lo < 0 || pos < lo {
				lo = pos
			}
		}
		first = max(first, lo)
		off += int(p.size(cells))
	}
	if off != len(state) {
		return -1, fmt.Errorf("the layout's parts hold %d bytes, the state %d", off, len(state))
	}
	return first, nil
}
