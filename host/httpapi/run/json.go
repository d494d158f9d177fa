package run

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
)

// DecodeJSON decodes a request body into v, a pointer to a struct, and
// words a failure for the client: which field (the error's param too), what
// it expected, where the JSON broke. encoding/json's own messages name the Go types it decodes into
// ("…of type []host.ChatMessage"), which mean nothing to a client and show
// the engine's insides.
func DecodeJSON(body []byte, v any) error {
	if err := json.Unmarshal(body, v); err != nil {
		return decodeError(err, reflect.TypeOf(v))
	}
	return nil
}

// DecodeField decodes raw, the JSON value of the body's field key, into that
// field of the struct v points to (an embedded struct's included), and
// words a failure as DecodeJSON words it for a body holding the field.
func DecodeField(v any, key string, raw json.RawMessage) error {
	f, ok := fieldValue(reflect.ValueOf(v).Elem(), key)
	if !ok {
		return fmt.Errorf("%T has no field %q", v, key)
	}
	err := json.Unmarshal(raw, f.Addr().Interface())
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		te.Field = strings.TrimSuffix(key+"."+te.Field, ".")
	}
	if err != nil {
		return decodeError(err, reflect.TypeOf(v))
	}
	return nil
}

// fieldValue is the field of struct s whose JSON key is key, looking into
// embedded structs as jsonField does.
func fieldValue(s reflect.Value, key string) (reflect.Value, bool) {
	for i := range s.NumField() {
		f := s.Type().Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" {
			name = f.Name
		}
		if f.IsExported() && !f.Anonymous && strings.EqualFold(name, key) {
			return s.Field(i), true
		}
		if f.Anonymous && f.Type.Kind() == reflect.Struct {
			if v, ok := fieldValue(s.Field(i), key); ok {
				return v, true
			}
		}
	}
	return reflect.Value{}, false
}

// decodeError words a decoding failure into root for the client, the field
// at fault its param.
func decodeError(err error, root reflect.Type) *Error {
	var param any
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) && te.Field != "" { // before jsonErrorText words the field
		param = clientPath(root, te.Field)
	}
	e := BadRequest("%s", JSONErrorText(err, root))
	if param != nil {
		e.Param = param
	}
	return e
}

// JSONErrorText says in JSON terms why decoding into root failed.
func JSONErrorText(err error, root reflect.Type) string {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		return fmt.Sprintf("request body is not valid JSON: %s (at offset %d)", se.Error(), se.Offset)
	case errors.As(err, &te):
		return typeErrorText(te, root)
	default:
		return "request body could not be decoded as JSON"
	}
}

// typeErrorText words a value of the wrong JSON type.
func typeErrorText(te *json.UnmarshalTypeError, root reflect.Type) string {
	got := jsonValueText(te.Value)
	if te.Field == "" {
		return "request body must be a JSON object, got " + got
	}
	te.Field = clientPath(root, te.Field)
	want := indirect(te.Type)
	if ft := indirect(fieldType(root, te.Field, true)); ft != nil && ft != want &&
		(ft.Kind() == reflect.Slice || ft.Kind() == reflect.Array) && indirect(ft.Elem()) == want {
		return fmt.Sprintf("field %s: expected an array of %s, got an element that is %s", te.Field, jsonPlural(want), got)
	}
	if isInteger(want) {
		if num, ok := strings.CutPrefix(te.Value, "number "); ok && !strings.ContainsAny(num, ".eE") {
			return fmt.Sprintf("field %s: %s is out of range", te.Field, num)
		}
		return fmt.Sprintf("field %s: expected an integer, got %s", te.Field, got)
	}
	return fmt.Sprintf("field %s: expected %s, got %s", te.Field, jsonKindText(want), got)
}

// jsonValueText names the JSON value UnmarshalTypeError.Value describes:
// "string", "number", "number 1.5", "bool", "array", "object".
func jsonValueText(v string) string {
	if num, ok := strings.CutPrefix(v, "number "); ok {
		return num
	}
	switch v {
	case "string":
		return "a string"
	case "number":
		return "a number"
	case "bool":
		return "a boolean"
	case "array":
		return "an array"
	case "object":
		return "an object"
	}
	return "a value of another type"
}

// jsonKindText names the JSON value a Go type decodes from.
func jsonKindText(t reflect.Type) string {
	switch {
	case t == nil:
		return "a value of another type"
	case isInteger(t):
		return "an integer"
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Struct, reflect.Map:
		return "an object"
	}
	return "a value of another type"
}

// jsonPlural is jsonKindText for "an array of …".
func jsonPlural(t reflect.Type) string {
	s := jsonKindText(t)
	for _, article := range []string{"a ", "an "} {
		if rest, ok := strings.CutPrefix(s, article); ok {
			return rest + "s"
		}
	}
	return s
}

func isInteger(t reflect.Type) bool {
	if t == nil {
		return false
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return true
	}
	return false
}

// indirect looks through pointers.
func indirect(t reflect.Type) reflect.Type {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t
}

// fieldType is the Go type at a dotted JSON field path (as
// UnmarshalTypeError.Field gives it) below t, looking through pointers and
// array elements; nil when the path leads nowhere.
func fieldType(t reflect.Type, path string, promoted bool) reflect.Type {
	for name := range strings.SplitSeq(path, ".") {
		t = elemStruct(t)
		if t == nil {
			return nil
		}
		f, ok := jsonField(t, name, promoted)
		if !ok {
			return nil
		}
		t = f.Type
	}
	return t
}

// elemStruct is the struct a value of t holds (through pointers, slices and
// arrays), or nil.
func elemStruct(t reflect.Type) reflect.Type {
	t = indirect(t)
	for t != nil && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
		t = indirect(t.Elem())
	}
	if t == nil || t.Kind() != reflect.Struct {
		return nil
	}
	return t
}

// clientPath is encoding/json's field path as the client wrote it: the Go
// names of embedded structs it includes ("SamplerFields.temperature") are
// not keys of the request.
func clientPath(root reflect.Type, path string) string {
	var keys []string
	t := root
	for name := range strings.SplitSeq(path, ".") {
		st := elemStruct(t)
		if st == nil {
			keys = append(keys, name)
			continue
		}
		f, ok := jsonField(st, name, false)
		if !ok {
			keys = append(keys, name)
			t = nil
			continue
		}
		if !f.Anonymous {
			keys = append(keys, name)
		}
		t = f.Type
	}
	return strings.Join(keys, ".")
}

// jsonField finds the field of struct t that JSON key name decodes into,
// looking into embedded structs' promoted fields when promoted is set.
func jsonField(t reflect.Type, name string, promoted bool) (reflect.StructField, bool) {
	for i := range t.NumField() {
		f := t.Field(i)
		key, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if key == "" {
			key = f.Name
		}
		if (f.IsExported() || f.Anonymous) && strings.EqualFold(key, name) { // encoding/json names an embedded struct by its type, exported or not
			return f, true
		}
		if promoted && f.Anonymous {
			if st := elemStruct(f.Type); st != nil {
				if pf, ok := jsonField(st, name, true); ok {
					return pf, true
				}
			}
		}
	}
	return reflect.StructField{}, false
}
