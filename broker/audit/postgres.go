package audit

import "github.com/rs/zerolog"

// PostgresCall is the audit event's "postgres" object (CONTRACT §8b): the connection's
// database, upstream, requested user, application name and TLS, and, for the connection's
// event, the Vault role and lease it logged in with and its statements counted by kind; for
// a refused or held statement's event, that statement.
type PostgresCall struct {
	Database, Upstream, User, ApplicationName string
	TLS                                       bool
	Role, LeaseID                             string
	// Statements counts the connection's statements by kind (read, write, ddl, other).
	Statements map[string]int64
	Statement  *PostgresStatement
}

// PostgresStatement is one statement as the policy saw it. Text has its literals replaced by
// "?" unless audit.include_input is full.
type PostgresStatement struct {
	Kind, Command     string
	Tables, Functions []string
	Text              string
}

// MarshalZerologObject implements zerolog.LogObjectMarshaler.
func (p *PostgresCall) MarshalZerologObject(e *zerolog.Event) {
	e.Str("database", p.Database).Str("upstream", p.Upstream).Str("user", p.User).
		Str("application_name", p.ApplicationName).Bool("tls", p.TLS)
	if p.Role != "" {
		e.Str("role", p.Role)
	}
	if p.LeaseID != "" {
		e.Str("lease_id", p.LeaseID)
	}
	if p.Statements != nil {
		d := zerolog.Dict()
		for _, k := range []string{"read", "write", "ddl", "other"} {
			d = d.Int64(k, p.Statements[k])
		}
		e.Dict("statements", d)
	}
	if s := p.Statement; s != nil {
		e.Dict("statement", zerolog.Dict().Str("kind", s.Kind).Str("command", s.Command).
			Strs("tables", nonNil(s.Tables)).Strs("functions", nonNil(s.Functions)).Str("text", s.Text))
	}
}
