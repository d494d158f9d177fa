package host

import "testing"

func TestCountDrafts(t *testing.T) {
	var s Stats
	s.CountDrafts(6, 4)
	s.CountDrafts(0, 0)
	s.CountDrafts(3, 3)
	if v, a := s.Drafts(); v != 9 || a != 7 {
		t.Errorf("drafts %d verified, %d accepted; want 9, 7", v, a)
	}
}
