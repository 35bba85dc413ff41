package strictjson

import (
	"bytes"
	"reflect"
	"strings"
	"sync"

	"github.com/go-json-experiment/json/jsontext"
)

// fields are the member names a struct type is decoded from: by exact name, the field's type;
// by fold key (fold), the exact name.
type fields struct {
	exact  map[string]reflect.Type
	folded map[string]string
}

var fieldsOf sync.Map // reflect.Type -> *fields

// structFields returns t's fields as json v2 names them: a field's tag name, else its Go name;
// an embedded struct without a tag name contributes its own fields.
func structFields(t reflect.Type) *fields {
	if f, ok := fieldsOf.Load(t); ok {
		return f.(*fields)
	}
	f := &fields{exact: map[string]reflect.Type{}, folded: map[string]string{}}
	var add func(t reflect.Type)
	add = func(t reflect.Type) {
		for i := range t.NumField() {
			sf := t.Field(i)
			tag, ok := sf.Tag.Lookup("json")
			name, _, _ := strings.Cut(tag, ",")
			if name == "-" && !strings.Contains(tag, ",") {
				continue
			}
			if sf.Anonymous && name == "" && sf.Type.Kind() == reflect.Struct {
				add(sf.Type)
				continue
			}
			if !sf.IsExported() && !ok {
				continue
			}
			if name == "" {
				name = sf.Name
			}
			f.exact[name] = sf.Type
			f.folded[fold(name)] = name
		}
	}
	add(t)
	v, _ := fieldsOf.LoadOrStore(t, f)
	return v.(*fields)
}

// folded reports, as an ErrAmbiguous, a member of b (which Check accepted) that would be decoded
// into a field of t only by a case-insensitive match: not the field's exact name, but the same
// under fold. Members of maps and of values kept raw are data, not field names, and are not
// looked at.
func folded(b []byte, t reflect.Type) error {
	if !hasStruct(t, map[reflect.Type]bool{}) {
		return nil
	}
	w := walkers.Get().(*walker)
	defer w.release()
	w.bb = *bytes.NewBuffer(b)
	w.dec.Reset(&w.bb, jsontext.AllowDuplicateNames(true)) // Check has refused them
	return w.walk(t)
}

// walker is the state of one folded walk, kept in a pool: a decoder reading the input in
// place, and room for a name's fold key.
type walker struct {
	bb      bytes.Buffer
	dec     jsontext.Decoder
	scratch []byte
}

var walkers = sync.Pool{New: func() any { return new(walker) }}

func (w *walker) release() {
	w.bb = bytes.Buffer{}
	w.dec.Reset(&w.bb)
	if cap(w.scratch) <= 4096 {
		walkers.Put(w)
	}
}

var rawValue = reflect.TypeFor[jsontext.Value]()

// hasStruct reports whether a value of t can hold a struct that Unmarshal decodes by name.
func hasStruct(t reflect.Type, seen map[reflect.Type]bool) bool {
	if t == rawValue || seen[t] {
		return false
	}
	seen[t] = true
	switch t.Kind() {
	case reflect.Pointer, reflect.Slice, reflect.Array, reflect.Map:
		return hasStruct(t.Elem(), seen)
	case reflect.Struct:
		return true
	}
	return false
}

// walk reads the next value from the decoder as one decoded into a t.
func (w *walker) walk(t reflect.Type) error {
	dec := &w.dec
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	kind := dec.PeekKind()
	switch {
	case t.Kind() == reflect.Struct && kind == '{' && t != rawValue:
		f := structFields(t)
		if _, err := dec.ReadToken(); err != nil {
			return err
		}
		for dec.PeekKind() != '}' {
			raw, err := dec.ReadValue() // the name, as it is in the input
			if err != nil {
				return err
			}
			if w.scratch, err = jsontext.AppendUnquote(w.scratch[:0], raw); err != nil {
				return err
			}
			ft, ok := f.exact[string(w.scratch)]
			if !ok {
				n := len(w.scratch)
				w.scratch = appendFold(w.scratch, w.scratch[:n])
				if exact, ok := f.folded[string(w.scratch[n:])]; ok {
					return &Error{Offset: dec.InputOffset(), Names: [2]string{exact, string(w.scratch[:n])}, kind: ErrAmbiguous, field: true}
				}
				if err := dec.SkipValue(); err != nil {
					return err
				}
				continue
			}
			if err := w.walk(ft); err != nil {
				return err
			}
		}
		_, err := dec.ReadToken()
		return err
	case (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) && kind == '[' && t != rawValue:
		if _, err := dec.ReadToken(); err != nil {
			return err
		}
		for dec.PeekKind() != ']' {
			if err := w.walk(t.Elem()); err != nil {
				return err
			}
		}
		_, err := dec.ReadToken()
		return err
	case t.Kind() == reflect.Map && kind == '{' && hasStruct(t.Elem(), map[reflect.Type]bool{}):
		if _, err := dec.ReadToken(); err != nil {
			return err
		}
		for dec.PeekKind() != '}' {
			if err := dec.SkipValue(); err != nil { // the key: data
				return err
			}
			if err := w.walk(t.Elem()); err != nil {
				return err
			}
		}
		_, err := dec.ReadToken()
		return err
	}
	return dec.SkipValue()
}
