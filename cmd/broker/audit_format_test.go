package main

import (
	"os"
	"testing"

	"github.com/capbroker/capbroker/broker/audit"
	"github.com/capbroker/capbroker/broker/audit/ocsf"
	"github.com/capbroker/capbroker/broker/config"
)

func TestAuditOptions(t *testing.T) {
	host, _ := os.Hostname()
	t.Setenv("POD_NAME", "")
	for name, c := range map[string]struct {
		cfg      config.Audit
		pod      string
		ocsf     bool
		instance string
	}{
		"default":       {instance: host},
		"json":          {cfg: config.Audit{Format: "json"}, instance: host},
		"ocsf, named":   {cfg: config.Audit{Format: "ocsf", Instance: "b-1"}, ocsf: true, instance: "b-1"},
		"pod name":      {pod: "broker-7d9c-x2", instance: "broker-7d9c-x2"},
		"name over pod": {cfg: config.Audit{Instance: "b-2"}, pod: "broker-7d9c-x2", instance: "b-2"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Setenv("POD_NAME", c.pod)
			o := auditOptions(c.cfg)
			if _, isOCSF := o.Encoder.(*ocsf.Encoder); isOCSF != c.ocsf || (!c.ocsf && o.Encoder != nil && o.Encoder != audit.JSON) {
				t.Errorf("encoder %T", o.Encoder)
			}
			if o.Instance != c.instance {
				t.Errorf("instance %q, want %q", o.Instance, c.instance)
			}
		})
	}
}
