package ocsf

import (
	"strings"

	"github.com/capbroker/capbroker/broker/audit"
)

// Approval appends a User Access Management event (3005): a person's (or the clock's) action
// on a held request or a grant. The user is the agent the privilege is for, the actor the
// person who decided; approving or granting assigns it, revoking revokes it, and denying,
// timing out and the like are "Other" activities with their name.
func (c *Encoder) Approval(dst []byte, a *audit.ApprovalEvent, m audit.Meta) []byte {
	var ev event
	c.approval(&ev, a, m)
	return appendLine(dst, &ev)
}

// approval fills the User Access Management event of an approval event.
func (c *Encoder) approval(ev *event, a *audit.ApprovalEvent, m audit.Meta) {
	activity, name := 99, strings.ToUpper(a.Action[:min(1, len(a.Action))])+a.Action[min(1, len(a.Action)):]
	ev.StatusID, ev.Status = 1, "Success"
	switch a.Action {
	case audit.ActionApprove, audit.ActionGrant:
		activity, name = 1, "Assign Privileges"
	case audit.ActionRevoke:
		activity, name = 2, "Revoke Privileges"
	default: // deny, timeout, withdrawn, interrupted: nothing was assigned
		ev.StatusID, ev.Status = 2, "Failure"
		ev.StatusDetail = a.Action
	}
	ev.SeverityID = sevInformational
	c.base(ev, classUserAccess, activity, name, m, a.RequestID)
	ev.Metadata.UID = a.ID
	agent := a.Agent
	if agent == "" {
		agent = "*" // a grant for every agent
	}
	ev.User = &user{Name: agent, UID: a.Agent, TypeID: 4, Type: "Service"}
	if a.By != "" {
		ev.Actor = &actor{User: &user{Name: a.By, TypeID: 1, Type: "User"}}
	}
	ev.Privileges = []string{privilege(a)}
	if a.Host != "" {
		ev.Resources = []resource{{Name: a.Host, Type: "host"}}
	}
	ev.Message = "approval " + a.Action
	if a.By != "" {
		ev.Message += " by " + a.By
	}
	ev.Message += ": " + ev.Privileges[0] + " for " + agent
	u := &approvalNative{Action: a.Action, ID: a.ID, RequestID: a.RequestID, Scope: a.Scope, Comment: a.Comment}
	if !a.Expires.IsZero() {
		u.Expires = a.Expires.UTC().Format("2006-01-02T15:04:05Z07:00")
	}
	ev.Unmapped = u
	ev.Metadata.Profiles = profilesOf(ev)
}

// privilege names what an approval is about: its scope and target, "once GET
// https://api.example.com:443/repos".
func privilege(a *audit.ApprovalEvent) string {
	var b strings.Builder
	b.WriteString(a.Scope)
	if a.Method != "" {
		b.WriteString(" " + a.Method)
	}
	b.WriteString(" ")
	if a.Scheme != "" {
		b.WriteString(a.Scheme + "://")
	}
	b.WriteString(a.Host)
	if a.Port != 0 {
		b.WriteString(":" + itoa(a.Port))
	}
	b.WriteString(a.PathPrefix)
	return strings.TrimSpace(b.String())
}

// approvalNative is the approval event's own fields OCSF has no attribute for.
type approvalNative struct {
	Action    string `json:"action"`
	ID        string `json:"id"`
	RequestID string `json:"request_id,omitempty"`
	Scope     string `json:"scope,omitempty"`
	Comment   string `json:"comment,omitempty"`
	Expires   string `json:"expires,omitempty"`
}
