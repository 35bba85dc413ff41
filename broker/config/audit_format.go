package config

// The audit log's formats (audit.format, CONTRACT §8b).
const (
	AuditJSON = "json" // the broker's own line (CONTRACT §6), the default
	AuditOCSF = "ocsf" // OCSF 1.x events (docs/observability.md)
)

// Audit.Format is AuditJSON ("" too) or AuditOCSF; Audit.Instance names this broker replica in
// every event ("instance"), "" meaning $POD_NAME or the host name.

func (a Audit) validateFormat(e *errs) {
	switch a.Format {
	case "", AuditJSON, AuditOCSF:
	default:
		e.add("audit.format", "must be %q or %q, not %q", AuditJSON, AuditOCSF, a.Format)
	}
	if len(a.Instance) > 253 {
		e.add("audit.instance", "at most 253 characters")
	}
}
