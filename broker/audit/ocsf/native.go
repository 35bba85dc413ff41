package ocsf

import (
	"bytes"
	stdjson "encoding/json"
)

// Native turns the OCSF line of a decision's activity event back into the broker's own JSON
// line, as far as the tools that read an audit log need it (`broker policy replay`, `broker
// policy learn`): msg, request_id, agent, phase, method, host, path, decision, reason,
// credentials, would_deny, error and input. ok is false for any other line: a finding, an
// approval event, a line that is not OCSF (the broker's own line is read as it is).
func Native(line []byte) (native []byte, ok bool) {
	if !bytes.Contains(line, []byte(`"class_uid"`)) {
		return nil, false
	}
	var ev struct {
		ClassUID     int    `json:"class_uid"`
		ActivityID   int    `json:"activity_id"`
		ActivityName string `json:"activity_name"`
		StatusDetail string `json:"status_detail"`
		Metadata     struct {
			CorrelationUID string `json:"correlation_uid"`
		} `json:"metadata"`
		Actor *struct {
			User *struct {
				UID string `json:"uid"`
			} `json:"user"`
		} `json:"actor"`
		DstEndpoint *struct {
			Hostname string `json:"hostname"`
			IP       string `json:"ip"`
		} `json:"dst_endpoint"`
		HTTPRequest *struct {
			HTTPMethod string `json:"http_method"`
			URL        *struct {
				Hostname string `json:"hostname"`
				Path     string `json:"path"`
			} `json:"url"`
		} `json:"http_request"`
		Query *struct {
			Hostname string `json:"hostname"`
			Type     string `json:"type"`
		} `json:"query"`
		API *struct {
			Operation string `json:"operation"`
		} `json:"api"`
		Resources []struct {
			Name string `json:"name"`
			Type string `json:"type"`
		} `json:"resources"`
		Unmapped *struct {
			Decision    string             `json:"decision"`
			Phase       string             `json:"phase"`
			Credentials []string           `json:"credentials"`
			WouldDeny   bool               `json:"would_deny"`
			Error       string             `json:"error"`
			Input       stdjson.RawMessage `json:"input"`
		} `json:"unmapped"`
	}
	if stdjson.Unmarshal(line, &ev) != nil || ev.Unmapped == nil {
		return nil, false
	}
	switch ev.ClassUID {
	case classHTTPActivity, classNetworkActivity, classDNSActivity, classAPIActivity:
	default:
		return nil, false
	}
	u := ev.Unmapped
	out := struct {
		Msg         string             `json:"msg"`
		RequestID   string             `json:"request_id"`
		Agent       string             `json:"agent"`
		Phase       string             `json:"phase"`
		Method      string             `json:"method"`
		Host        string             `json:"host"`
		Path        string             `json:"path,omitempty"`
		Decision    string             `json:"decision"`
		Reason      string             `json:"reason"`
		Credentials []string           `json:"credentials"`
		WouldDeny   bool               `json:"would_deny,omitempty"`
		Error       string             `json:"error,omitempty"`
		Input       stdjson.RawMessage `json:"input,omitempty"`
	}{Msg: "decision", RequestID: ev.Metadata.CorrelationUID, Phase: u.Phase, Decision: u.Decision, Reason: ev.StatusDetail,
		Credentials: u.Credentials, WouldDeny: u.WouldDeny, Error: u.Error, Input: u.Input}
	if a := ev.Actor; a != nil && a.User != nil {
		out.Agent = a.User.UID
	}
	if d := ev.DstEndpoint; d != nil {
		out.Host = d.Hostname + d.IP
	}
	switch {
	case ev.HTTPRequest != nil:
		out.Method = ev.HTTPRequest.HTTPMethod
		if out.Method == "" { // not one of the schema's methods: the activity names it
			out.Method = ev.ActivityName
		}
		if url := ev.HTTPRequest.URL; url != nil {
			out.Host, out.Path = url.Hostname, url.Path
		}
	case ev.Query != nil:
		out.Method, out.Host = ev.Query.Type, ev.Query.Hostname
	case u.Phase == "postgres" && ev.API != nil: // the command; the database is the path
		out.Method = ev.API.Operation
		for _, r := range ev.Resources {
			if r.Type == "database" {
				out.Path = "/" + r.Name
			}
		}
	case ev.ClassUID == classNetworkActivity && u.Phase != "ssh": // an SSH connection has no method
		out.Method = "CONNECT"
	}
	b, err := stdjson.Marshal(out)
	if err != nil {
		return nil, false
	}
	return b, true
}
