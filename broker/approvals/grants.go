package approvals

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/capbroker/capbroker/broker/audit"
)

// Grant lets later requests that an "ask" decision would hold through without asking: an
// "agent" grant for its duration, an "always" grant (policy data) until it is revoked.
type Grant struct {
	ID   string `json:"id"`
	Kind string `json:"kind"` // agent | always
	// Agent, Scheme, Host, Port, Method ("" any) and PathPrefix are what a request must
	// match: exactly the target the person was shown. A grant without a port (written before
	// grants had one) covers nothing.
	Agent      string     `json:"agent"`
	Method     string     `json:"method"`
	Scheme     string     `json:"scheme"`
	Host       string     `json:"host"`
	Port       int        `json:"port"`
	PathPrefix string     `json:"path_prefix"`
	Created    time.Time  `json:"created"`
	Expires    *time.Time `json:"expires,omitempty"`
	CreatedBy  string     `json:"created_by"`
	Comment    string     `json:"comment"`
}

// Target is a request as a grant is matched against it: the agent, and where the request
// goes, as the broker will send it (scheme, host, port, normalised path). A connect-phase
// request has no scheme and no path.
type Target struct {
	Agent  string
	Scheme string
	Host   string
	Port   int
	Method string
	Path   string
}

// Covers reports whether the grant matches a request: the same agent, scheme, host and port,
// the grant's method (or any), and a path under its prefix.
func (g *Grant) Covers(t Target) bool {
	return g.Port != 0 && g.Agent == t.Agent && g.Scheme == t.Scheme && g.Host == t.Host && g.Port == t.Port &&
		(g.Method == "" || g.Method == t.Method) && strings.HasPrefix(t.Path, g.PathPrefix)
}

// grantFor builds the grant an approval makes, or nil for "once".
func (q *Queue) grantFor(req Request, a Approval) (*Grant, error) {
	if a.Scope == ScopeOnce {
		return nil, nil
	}
	if a.Scope != ScopeAgent && a.Scope != ScopeAlways {
		return nil, fmt.Errorf("%w: scope must be once, agent or always, not %q", ErrBadRequest, a.Scope)
	}
	now := q.o.Now().UTC()
	g := &Grant{ID: newID("gr-"), Kind: a.Scope, Agent: req.Agent, Scheme: req.Scheme, Host: req.Host, Port: req.Port,
		Method: a.Method, PathPrefix: a.PathPrefix, Created: now, CreatedBy: a.By, Comment: a.Comment}
	switch g.Method {
	case "":
		g.Method = req.Method
	case "*":
		g.Method = ""
	}
	if g.PathPrefix == "" && req.Path != "" {
		g.PathPrefix = req.Path[:strings.LastIndexByte(req.Path, '/')+1]
	}
	if g.PathPrefix != "" && !strings.HasPrefix(g.PathPrefix, "/") {
		return nil, fmt.Errorf("%w: path_prefix must start with /", ErrBadRequest)
	}
	if !g.Covers(req.target()) {
		return nil, fmt.Errorf("%w: the grant (method %q, path_prefix %q) would not cover the request it approves", ErrBadRequest, g.Method, g.PathPrefix)
	}
	if a.Scope == ScopeAgent {
		d := a.Duration
		if d == 0 {
			d = DefaultGrantDuration
		}
		if d < 0 || d > MaxGrantDuration {
			return nil, fmt.Errorf("%w: duration must be positive and at most %s", ErrBadRequest, MaxGrantDuration)
		}
		exp := now.Add(d)
		g.Expires = &exp
	} else if !q.AlwaysAvailable() {
		return nil, fmt.Errorf("%w: \"always\" writes policy data, and this broker's policy is not a directory (nor has it a shared grants store)", ErrScope)
	}
	return g, nil
}

// storeAlways keeps an "always" grant: in the shared grants store when there is one (a fleet,
// whose policy directory every replica reads and none may write: Match finds it there, on
// every replica), else appended to approved.json. Either way it is kept before the request
// goes on: if it cannot be, the request stays held.
func (q *Queue) storeAlways(g Grant) error {
	if q.o.Grants != nil {
		if err := q.o.Grants.Put(g); err != nil {
			return fmt.Errorf("the grants store: %w", err)
		}
		q.mu.Lock()
		q.grants = append(q.grants, g)
		q.mu.Unlock()
		return nil
	}
	q.saveMu.Lock()
	defer q.saveMu.Unlock()
	list, err := q.readApproved()
	if err == nil {
		err = q.writeApproved(append(list, g))
	}
	if err != nil {
		return fmt.Errorf("writing %s: %w", ApprovedFile, err)
	}
	return nil
}

// addAgentGrant keeps an "agent" grant, in memory and in the state file.
func (q *Queue) addAgentGrant(g Grant) {
	q.mu.Lock()
	q.grants = append(q.grants, g)
	q.mu.Unlock()
	if q.o.Grants != nil {
		if err := q.o.Grants.Put(g); err != nil {
			q.o.Log.Error().Err(err).Msg("the grants store was not written: the grant holds on this broker until a restart")
		}
		return
	}
	if err := q.save(); err != nil {
		q.o.Log.Error().Err(err).Msg("approvals.state_file not written: the grant lasts until a restart")
	}
}

// grantAdded audits a new grant and tells the event stream.
func (q *Queue) grantAdded(g Grant) {
	ev := &audit.ApprovalEvent{Action: audit.ActionGrant, ID: g.ID, By: g.CreatedBy, Scope: g.Kind, Agent: g.Agent,
		Scheme: g.Scheme, Host: g.Host, Port: g.Port, Method: g.Method, PathPrefix: g.PathPrefix, Comment: g.Comment}
	if g.Expires != nil {
		ev.Expires = *g.Expires
	}
	q.audit(ev)
	q.Events.grant(g.ID, "added")
}

// Match returns a live grant covering the request, or nil: an "agent" grant, or an "always"
// one of the shared grants store. The "always" grants of approved.json are policy data: the
// policy reads data.approved and stops asking.
func (q *Queue) Match(t Target) *Grant {
	q.sync()
	now := q.o.Now()
	q.mu.Lock()
	defer q.mu.Unlock()
	for i := range q.grants {
		g := &q.grants[i]
		if g.Expires != nil && !now.Before(*g.Expires) {
			continue
		}
		if g.Covers(t) {
			c := *g
			return &c
		}
	}
	return nil
}

// Grants lists the live grants: those kept in memory or in the shared store ("agent" ones, and
// "always" ones in a fleet), then the "always" ones of approved.json.
func (q *Queue) Grants() []Grant {
	q.sync()
	now := q.o.Now()
	q.mu.Lock()
	q.grants = slices.DeleteFunc(q.grants, func(g Grant) bool { return g.Expires != nil && !now.Before(*g.Expires) })
	out := slices.Clone(q.grants)
	q.mu.Unlock()
	if q.AlwaysAvailable() {
		always, err := q.readApproved()
		if err != nil {
			q.o.Log.Warn().Err(err).Msg("reading " + ApprovedFile)
		}
		out = append(out, always...)
	}
	if out == nil {
		out = []Grant{}
	}
	return out
}

// Revoke ends a grant.
func (q *Queue) Revoke(id, by string) error {
	q.sync()
	q.mu.Lock()
	i := slices.IndexFunc(q.grants, func(g Grant) bool { return g.ID == id })
	var g Grant
	if i >= 0 {
		g = q.grants[i]
		q.grants = slices.Delete(q.grants, i, i+1)
	}
	q.mu.Unlock()
	if i >= 0 && q.o.Grants != nil {
		if err := q.o.Grants.Delete(id); err != nil {
			return fmt.Errorf("the grants store: %w", err)
		}
	} else if i >= 0 {
		if err := q.save(); err != nil {
			return fmt.Errorf("approvals.state_file: %w", err)
		}
	} else {
		if !q.AlwaysAvailable() {
			return fmt.Errorf("%w: %s", ErrNotFound, id)
		}
		q.saveMu.Lock()
		list, err := q.readApproved()
		j := slices.IndexFunc(list, func(g Grant) bool { return g.ID == id })
		if err == nil && j >= 0 {
			g = list[j]
			err = q.writeApproved(slices.Delete(list, j, j+1))
		}
		q.saveMu.Unlock()
		if err != nil {
			return fmt.Errorf("writing %s: %w", ApprovedFile, err)
		}
		if j < 0 {
			return fmt.Errorf("%w: %s", ErrNotFound, id)
		}
	}
	q.audit(&audit.ApprovalEvent{Action: audit.ActionRevoke, ID: g.ID, By: by, Scope: g.Kind, Agent: g.Agent,
		Scheme: g.Scheme, Host: g.Host, Port: g.Port, Method: g.Method, PathPrefix: g.PathPrefix})
	q.Events.grant(g.ID, "revoked")
	return nil
}

// stateFile is the JSON of approvals.state_file.
type stateFile struct {
	Version int     `json:"version"`
	Grants  []Grant `json:"grants"`
}

// load reads the grants: from the shared store, after moving the state file's grants into it
// (migrate); or from the state file, whose directory must be writable. A missing file is no
// grants; an unreadable one is an error: grants must not vanish silently.
func (q *Queue) load() error {
	if q.o.Grants != nil {
		if err := q.migrate(); err != nil {
			return err
		}
		gs, err := q.o.Grants.List()
		if err != nil {
			return fmt.Errorf("the grants store: %w", err)
		}
		q.grants = gs
		return nil
	}
	if q.o.StateFile == "" {
		return nil
	}
	gs, err := readStateFile(q.o.StateFile, q.o.Now())
	if err != nil {
		return err
	}
	q.grants = gs
	return writable(q.o.StateFile)
}

// readStateFile returns the live "agent" grants of a state file; none when it does not exist.
func readStateFile(path string, now time.Time) ([]Grant, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("approvals.state_file: %w", err)
	}
	var st stateFile
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("approvals.state_file %s: not a state file: %w", path, err)
	}
	var out []Grant
	for _, g := range st.Grants {
		if g.Kind == ScopeAgent && g.Expires != nil && now.Before(*g.Expires) {
			out = append(out, g)
		}
	}
	return out, nil
}

// writable checks, at start, that the state file can be written where it is, as save writes
// it (a new file beside it, renamed over it): otherwise the first grant would fail, long after
// the broker was deployed.
func writable(path string) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".check*")
	if err != nil {
		return fmt.Errorf("approvals.state_file %s: grants could not be kept, its directory is not writable: %w "+
			"(set approvals.state_file to a file in a writable directory, or configure budgets.store.redis)", path, err)
	}
	name := f.Name()
	f.Close()
	return os.Remove(name)
}

// save writes the "agent" grants to the state file, atomically.
func (q *Queue) save() error {
	if q.o.StateFile == "" {
		return nil
	}
	q.saveMu.Lock()
	defer q.saveMu.Unlock()
	q.mu.Lock()
	st := stateFile{Version: 1, Grants: slices.Clone(q.grants)}
	q.mu.Unlock()
	if st.Grants == nil {
		st.Grants = []Grant{}
	}
	b, _ := json.MarshalIndent(st, "", "  ")
	return writeAtomic(q.o.StateFile, append(b, '\n'), 0o600)
}

// ApprovedFile is the policy data file "always" approvals write, in the policy directory:
// {"approved": [grant...]}, read by a policy as data.approved.
const ApprovedFile = "approved.json"

type approvedDoc struct {
	Approved []Grant `json:"approved"`
}

func (q *Queue) readApproved() ([]Grant, error) {
	b, err := os.ReadFile(filepath.Join(q.o.PolicyDir, ApprovedFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var doc approvedDoc
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, err
	}
	for i := range doc.Approved {
		doc.Approved[i].Kind = ScopeAlways
	}
	return doc.Approved, nil
}

func (q *Queue) writeApproved(list []Grant) error {
	if list == nil {
		list = []Grant{}
	}
	b, _ := json.MarshalIndent(approvedDoc{list}, "", "  ")
	return writeAtomic(filepath.Join(q.o.PolicyDir, ApprovedFile), append(b, '\n'), 0o644)
}

// writeAtomic replaces path with data: a temporary file beside it, synced, renamed over it,
// and the directory synced. A reader sees the old file or the new one, never a part.
func writeAtomic(path string, data []byte, perm os.FileMode) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(perm)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return err
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	return nil
}
