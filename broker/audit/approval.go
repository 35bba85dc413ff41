package audit

import (
	"time"

	"github.com/rs/zerolog"
)

// Approval is how a held request was decided, in its decision event ("approval"), and the
// object of an approval event.
type Approval struct {
	// ID is the held request's (or, for a grant's events, the grant's) id.
	ID string
	// Outcome is approved, denied, timeout, withdrawn, interrupted, or granted (an existing
	// grant answered the ask).
	Outcome string
	By      string
	Scope   string
	Comment string
	// Grant is the id of the grant that answered the ask, or that the approval made.
	Grant string
}

// MarshalZerologObject writes the approval's fields.
func (a *Approval) MarshalZerologObject(e *zerolog.Event) {
	e.Str("id", a.ID).Str("outcome", a.Outcome).Str("by", a.By).Str("scope", a.Scope)
	if a.Comment != "" {
		e.Str("comment", a.Comment)
	}
	if a.Grant != "" {
		e.Str("grant", a.Grant)
	}
}

// Approval actions (ApprovalEvent.Action).
const (
	ActionApprove   = "approve"
	ActionDeny      = "deny"
	ActionTimeout   = "timeout"
	ActionWithdrawn = "withdrawn"
	ActionGrant     = "grant"
	ActionRevoke    = "revoke"
	// ActionInterrupted: the broker stopped while the request was held.
	ActionInterrupted = "interrupted"
)

// ApprovalEvent is a person's (or the clock's) action on a held request or a grant: an event
// of its own ("msg": "approval"), beside the held request's decision event.
type ApprovalEvent struct {
	Action     string
	ID         string // the held request's id, or the grant's for grant and revoke
	RequestID  string // the held request's request_id, when there is one
	By         string
	Scope      string
	Agent      string
	Scheme     string // of a grant; "" for a connect-phase one
	Host       string
	Port       int // of a held request or a grant; 0 when unknown
	Method     string
	PathPrefix string
	Expires    time.Time
	Comment    string
}

// WriteApproval records an approval action.
func (l *Logger) WriteApproval(a *ApprovalEvent) {
	m := Meta{Time: l.now(), Instance: l.instance}
	l.emit(nil, func(enc Encoder, dst []byte) []byte { return enc.Approval(dst, a, m) })
}

// Tap is given every event the Logger writes (a decision or an approval event) as the broker's
// own JSON line, with its newline, whatever audit.format the log is written in, before it is
// queued. It must not keep line, nor block.
type Tap func(line []byte)

// SetTap sets the function every event line is given (nil for none). With none, writing an
// event costs one atomic load more; with one and an encoder other than JSON, the JSON line is
// encoded as well.
func (l *Logger) SetTap(t Tap) {
	if t == nil {
		l.tap.Store(nil)
		return
	}
	l.tap.Store(&t)
}

// CredentialHeader reports whether a header name looks like one that carries a credential
// (the words the audit log drops headers by).
func CredentialHeader(name string) bool { return credentialHeader(name) }
