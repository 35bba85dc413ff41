package main

import (
	"os"

	"github.com/capbroker/capbroker/broker/audit"
	"github.com/capbroker/capbroker/broker/audit/ocsf"
	"github.com/capbroker/capbroker/broker/config"
)

// auditOptions are the audit log's encoding (audit.format) and replica name (audit.instance,
// else $POD_NAME, else the host name).
func auditOptions(a config.Audit) audit.Options {
	o := audit.Options{Instance: a.Instance}
	if o.Instance == "" {
		o.Instance = os.Getenv("POD_NAME")
	}
	if o.Instance == "" {
		o.Instance, _ = os.Hostname()
	}
	if a.Format == config.AuditOCSF {
		o.Encoder = ocsf.New(ocsf.Options{ProductVersion: version})
	}
	return o
}
