package credentials

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/capbroker/capbroker/credentials/vaulttest"
)

const (
	fieldKeyID  = "AKIAFIELDSCANARY0001"
	fieldSecret = "fields-canary-secret-key-do-not-print"
	fieldToken  = "fields-canary-session-token-do-not-print"
)

func TestSecretFields(t *testing.T) {
	s := NewFields(map[string]string{"access_key_id": fieldKeyID, "secret_access_key": fieldSecret, "region": "eu-1", "empty": ""})
	if v, ok := s.Field("secret_access_key"); !ok || v != fieldSecret {
		t.Fatalf("Field = %q, %v", v, ok)
	}
	if _, ok := s.Field("empty"); ok {
		t.Error("an empty field is kept")
	}
	if got := s.FieldNames(); !slices.Equal(got, []string{"access_key_id", "region", "secret_access_key"}) {
		t.Errorf("FieldNames = %v", got)
	}
	// Values: every part long enough to be a secret, never the JSON object.
	var vals []string
	for _, v := range s.Values() {
		vals = append(vals, v.Reveal())
	}
	if !slices.Equal(vals, []string{fieldKeyID, fieldSecret}) {
		t.Errorf("Values = %v", vals)
	}
	// Equal fields are equal values, so the broker knows them as one.
	if s.Reveal() != NewFields(map[string]string{"secret_access_key": fieldSecret, "region": "eu-1", "access_key_id": fieldKeyID}).Reveal() {
		t.Error("equal fields compare different")
	}
	// Redacted wherever it is printed.
	j, _ := json.Marshal(s)
	for _, out := range []string{fmt.Sprintf("%v %+v %#v %s", s, s, s, s), string(j)} {
		if strings.Contains(out, fieldSecret) || strings.Contains(out, fieldKeyID) {
			t.Errorf("printed: %s", out)
		}
	}
	if !NewFields(map[string]string{"a": ""}).IsZero() {
		t.Error("all-empty fields are not zero")
	}
	if v := NewSecret("plain-value-1").Values(); len(v) != 1 || v[0].Reveal() != "plain-value-1" {
		t.Errorf("single value Values = %v", v)
	}
}

func TestSourcesWithFields(t *testing.T) {
	doc := `{"access_key_id":"` + fieldKeyID + `","secret_access_key":"` + fieldSecret + `","n":3}`
	t.Setenv("FIELDS_TEST_JSON", doc)
	t.Setenv("FIELDS_TEST_ID", fieldKeyID)
	t.Setenv("FIELDS_TEST_SECRET", fieldSecret)
	t.Setenv("FIELDS_TEST_BAD", "not json "+fieldSecret)
	cases := map[string]struct {
		src     Source
		want    string // the secret_access_key field
		wantErr string
	}{
		"env json":   {src: Env{Name: "FIELDS_TEST_JSON", Fields: true}, want: fieldSecret},
		"file json":  {src: File{Path: writeFile(t, doc+"\n"), Fields: true}, want: fieldSecret},
		"env fields": {src: EnvFields{"access_key_id": "FIELDS_TEST_ID", "secret_access_key": "FIELDS_TEST_SECRET", "session_token": "FIELDS_TEST_UNSET"}, want: fieldSecret},
		"env not json": {src: Env{Name: "FIELDS_TEST_BAD", Fields: true},
			wantErr: "environment variable FIELDS_TEST_BAD: credential unavailable: not a JSON object"},
		"env fields none set": {src: EnvFields{"a": "FIELDS_TEST_UNSET1", "b": "FIELDS_TEST_UNSET2"},
			wantErr: "none of the environment variables FIELDS_TEST_UNSET1, FIELDS_TEST_UNSET2 is set"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			s, err := tc.src.Fetch(context.Background())
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				if strings.Contains(err.Error(), fieldSecret) {
					t.Fatalf("error carries the secret: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if v, _ := s.Field("secret_access_key"); v != tc.want {
				t.Errorf("secret_access_key = %q", v)
			}
			if v, _ := s.Field("access_key_id"); v != fieldKeyID {
				t.Errorf("access_key_id = %q", v)
			}
			if _, ok := s.Field("session_token"); ok {
				t.Error("unset session_token is a field")
			}
		})
	}
}

func TestVaultFields(t *testing.T) {
	t.Parallel()
	srv := vaulttest.Start(t)
	root := srv.Client()
	kvPut(t, root, "aws", map[string]any{"access_key_id": fieldKeyID, "secret_access_key": fieldSecret, "session_token": fieldToken, "n": 1})
	v := startVault(t, srv.Addr, rootAuth(t))
	src := v.Source("aws", VaultRef{Mount: "secret", Path: "aws", Fields: true})
	s, err := src.Fetch(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"access_key_id": fieldKeyID, "secret_access_key": fieldSecret, "session_token": fieldToken} {
		if got, _ := s.Field(name); got != want {
			t.Errorf("%s = %q", name, got)
		}
	}
	if _, ok := s.Field("n"); ok {
		t.Error("a number became a field")
	}
	if err := (VaultRef{Mount: "secret", Path: "aws", Field: "x", Fields: true}).Validate(); err == nil {
		t.Error("field and fields together validate")
	}
}
