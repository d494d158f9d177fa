package run

import (
	"errors"
	"net/http"
	"testing"
)

// TestCheckFields: an object's unknown key is a 400 naming it at its path;
// a value that is no object is a 400 naming its path, or the request body.
func TestCheckFields(t *testing.T) {
	known := []string{"a", "b"}
	for _, c := range []struct {
		raw, path string
		err       string // "": accepted
		param     any
	}{
		{`{"a":1,"b":2}`, "", "", nil},
		{`{}`, "tools[0]", "", nil},
		{`{"a":1,"z":2,"c":3}`, "", "c is not supported by this engine", "c"},
		{`{"x":1}`, "stream_options", "stream_options.x is not supported by this engine", "stream_options.x"},
		{`[1]`, "", "request body must be a JSON object", nil},
		{`"a"`, "", "request body must be a JSON object", nil},
		{`[1]`, "tools[0]", "tools[0] must be a JSON object", "tools[0]"},
		{`5`, "metadata", "metadata must be a JSON object", nil},
	} {
		err := CheckFields([]byte(c.raw), c.path, known)
		if c.err == "" {
			if err != nil {
				t.Errorf("%s at %q: %v", c.raw, c.path, err)
			}
			continue
		}
		var e *Error
		if !errors.As(err, &e) || e.Status != http.StatusBadRequest || e.Msg != c.err || e.Param != c.param {
			t.Errorf("%s at %q: %#v, want 400 %q (param %v)", c.raw, c.path, err, c.err, c.param)
		}
	}
}
