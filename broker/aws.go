package broker

import (
	"errors"
	"net/http"
	"net/url"

	"github.com/capbroker/capbroker/broker/audit"
	"github.com/capbroker/capbroker/broker/policy"
	"github.com/capbroker/capbroker/broker/wire"
	"github.com/capbroker/capbroker/credentials/aws"
)

// awsDescriber is a Signer that can say what an AWS request does (credentials/aws).
type awsDescriber interface {
	Describe(req *http.Request) (aws.Meaning, bool, error)
}

// describeAWS sets input.aws, and the audit event's aws object, for a request to a host an
// AWS signing credential is bound to: what the request does once signed, read from the path
// the broker sends (in.Path), not the one the agent wrote.
func (g *generation) describeAWS(x *exchange, r *http.Request, in *policy.Input) error {
	for _, name := range in.Credentials {
		d, ok := g.derived.Signer(name).(awsDescriber)
		if !ok {
			continue
		}
		// The path as sent: dot-segments resolved (an S3 key "ok/../secret" is "secret").
		u := *r.URL
		if p, err := url.PathUnescape(in.Path); err == nil {
			u.Path, u.RawPath = p, in.Path
		}
		req := *r
		req.URL = &u
		// Not describable (no service in the signature or the host name): input.aws is there
		// all the same, with empty members, so that the policy refuses it as such. What AWS
		// could read otherwise than described (two copy sources, an encoded one that decodes
		// to another bucket...) is refused, as a header given twice is (wire.CheckRequest).
		m, _, err := d.Describe(&req)
		r.Body, r.GetBody = req.Body, req.GetBody // Describe may have read a small form body and put it back
		if ae, ok := errors.AsType[*aws.AmbiguousError](err); ok {
			if ae.Header == "" {
				return wire.AmbiguousHeader("", ae.Error())
			}
			return wire.AmbiguousHeader(ae.Header, ae.Reason)
		}
		in.AWS = map[string]any{
			"service": m.Service, "region": m.Region, "operation": m.Operation,
			"bucket": m.Bucket, "key": m.Key,
		}
		if c := m.CopySource; c != nil {
			in.AWS["copy_source"] = map[string]any{"bucket": c.Bucket, "key": c.Key, "version_id": c.VersionID}
		}
		x.ev.AWS = &audit.AWSCall{Service: m.Service, Operation: m.Operation}
		return nil
	}
	return nil
}
