package strictjson

import (
	"bytes"
	"encoding/json"

	"github.com/go-json-experiment/json/jsontext"
)

// Value checks b (Check) and returns the value it holds as encoding/json gives it to an `any`
// (map[string]any, []any, string, bool, nil), except numbers: json.Number, their text as
// sent. A number no float64 holds (1e400) is a value like any other, never an error that
// would leave the whole text unread, and a large integer keeps its digits.
func Value(b []byte) (any, error) {
	if err := Check(b); err != nil {
		return nil, err
	}
	w := walkers.Get().(*walker)
	defer w.release()
	w.bb = *bytes.NewBuffer(b)
	w.dec.Reset(&w.bb, jsontext.AllowDuplicateNames(true)) // Check has refused them
	return value(&w.dec)
}

func value(dec *jsontext.Decoder) (any, error) {
	tok, err := dec.ReadToken()
	if err != nil {
		return nil, err
	}
	switch tok.Kind() {
	case '{':
		m := map[string]any{}
		for dec.PeekKind() != '}' {
			tok, err := dec.ReadToken()
			if err != nil {
				return nil, err
			}
			name := tok.String() // before the next read voids the token
			v, err := value(dec)
			if err != nil {
				return nil, err
			}
			m[name] = v
		}
		_, err := dec.ReadToken()
		return m, err
	case '[':
		l := []any{}
		for dec.PeekKind() != ']' {
			v, err := value(dec)
			if err != nil {
				return nil, err
			}
			l = append(l, v)
		}
		_, err := dec.ReadToken()
		return l, err
	case '"':
		return tok.String(), nil
	case '0':
		return json.Number(tok.String()), nil
	case 't', 'f':
		return tok.Bool(), nil
	}
	return nil, nil // null
}
