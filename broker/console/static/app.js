// capbroker console: talks to the admin API (/api/) of the origin it was served from.
//
// Security: everything shown comes from the API and much of it from agents (paths, headers,
// bodies, reasons). It is only ever set as text (textContent, property values), never parsed
// as HTML: this file uses no HTML-parsing sink at all (broker/console/console_test.go checks).
// State-changing calls carry the session's CSRF token in X-CSRF-Token.
'use strict';

(function () {
  const MAX_ROWS = 500;        // live decisions kept in the page
  const MAX_AGENTS = 500;      // options in the agent filter
  const REFRESH_MS = 10000;    // approvals and grants, besides the events that announce changes
  const STATUS_MS = 15000;
  const USAGE_MS = 1000;       // the usage panel reloads at most this often on metered decisions
  const RECENT_SHOWN = 20;     // recently decided approvals listed
  const HISTORY_SHOWN = 5;     // of an agent's earlier questions, on its pending card

  const state = {
    csrf: '',
    user: '',
    started: false,
    skew: 0,                   // server clock minus ours, ms (from the Date header)
    pending: new Map(),        // id -> {p, card, expiresEl, approve}
    focused: '',               // the #approval-ID already brought into view
    revision: '',              // the policy revision shown
    resolved: new Set(),       // ids answered from this page: a list fetched before is stale
    approvalsSeq: 0,
    recent: [],                // held requests decided lately, newest first (GET /api/approvals)
    seenDecisions: new Set(),  // request_ids drawn: the stream replays recent ones on (re)connect
    rows: [],                  // newest last; {ev, outcome}
    queue: [],                 // decisions not yet drawn
    frame: 0,
    paused: false,
    agents: new Set(),
    dropped: 0,
    events: null,
    reloadTimer: 0,
    retry: 0,
    usageTimer: 0,             // a usage reload is scheduled
    usageAt: 0,                // when the last one started (Date.now())
    usageSeq: 0,
  };

  const $ = (id) => document.getElementById(id);

  // el builds an element; string and number children become text nodes, never markup.
  function el(tag, props, ...children) {
    const e = document.createElement(tag);
    if (props) {
      for (const [k, v] of Object.entries(props)) {
        if (v === undefined || v === null) continue;
        if (k === 'class') e.className = v;
        else if (k === 'text') e.textContent = v;
        else if (k in e) e[k] = v;
        else if (v !== false) e.setAttribute(k, String(v));
      }
    }
    for (const c of children) {
      if (c === null || c === undefined || c === false) continue;
      e.append(typeof c === 'string' || typeof c === 'number' ? document.createTextNode(String(c)) : c);
    }
    return e;
  }

  function str(v) { return v === undefined || v === null ? '' : String(v); }

  // ---- API ----------------------------------------------------------------------------

  class APIError extends Error {
    constructor(status, body) {
      const b = body && typeof body === 'object' ? body : {};
      super(str(b.reason) || str(b.error) || ('HTTP ' + status));
      this.status = status;
      this.code = str(b.error);
    }
  }

  async function api(method, path, body) {
    const opts = { method, credentials: 'same-origin', cache: 'no-store', headers: { Accept: 'application/json' } };
    if (method !== 'GET' && method !== 'HEAD') opts.headers['X-CSRF-Token'] = state.csrf;
    if (body !== undefined) {
      opts.headers['Content-Type'] = 'application/json';
      opts.body = JSON.stringify(body);
    }
    const resp = await fetch(path, opts);
    const date = Date.parse(resp.headers.get('Date') || '');
    if (!Number.isNaN(date)) state.skew = date - Date.now();
    let data = null;
    try { data = await resp.json(); } catch (_) { data = null; }
    if (resp.status === 401 && path !== '/api/login') {
      showLogin();
    }
    if (!resp.ok) throw new APIError(resp.status, data);
    return data || {};
  }

  // ---- toast --------------------------------------------------------------------------

  let toastTimer = 0;
  function toast(msg, bad) {
    const t = $('toast');
    t.textContent = msg;
    t.classList.toggle('bad', !!bad);
    t.hidden = false;
    clearTimeout(toastTimer);
    toastTimer = setTimeout(() => { t.hidden = true; }, bad ? 7000 : 3500);
  }

  // ---- session ------------------------------------------------------------------------

  function showLogin() {
    stopStream();
    $('logout').hidden = true;
    state.started = false;
    $('app').hidden = true;
    $('login').hidden = false;
    $('token').focus();
  }

  async function boot() {
    try {
      const s = await api('GET', '/api/session');
      state.csrf = str(s.csrf);
      state.user = str(s.user);
      start();
    } catch (e) {
      if (e.status !== 401) {
        toast('Cannot reach the admin API: ' + e.message, true);
        setTimeout(boot, 3000);
      }
    }
  }

  async function login(ev) {
    ev.preventDefault();
    const errEl = $('login-error');
    errEl.hidden = true;
    $('login-button').disabled = true;
    try {
      const r = await api('POST', '/api/login', { token: $('token').value });
      state.csrf = str(r.csrf);
      $('token').value = '';
      try {
        const s = await api('GET', '/api/session');
        state.csrf = str(s.csrf) || state.csrf;
        state.user = str(s.user);
      } catch (_) { /* start anyway: the next call tells */ }
      start();
    } catch (e) {
      errEl.textContent = e.status === 401 || e.status === 403 ? 'The token was refused.' : ('Sign-in failed: ' + e.message);
      errEl.hidden = false;
    } finally {
      $('login-button').disabled = false;
    }
  }

  async function logout() {
    try {
      await api('POST', '/api/logout');
    } catch (e) {
      if (e.status !== 401) { toast('Sign-out failed: ' + e.message, true); return; }
    }
    state.csrf = '';
    state.user = '';
    $('logout').hidden = true;
    showLogin();
  }

  function start() {
    $('login').hidden = true;
    $('app').hidden = false;
    $('user').textContent = signedIn(state.user);
    // A session from signing in can be ended; loopback-only (local) and client certificates cannot.
    $('logout').hidden = !state.csrf || state.user === 'local' || !state.user;
    if (state.started) return;
    state.started = true;
    startStream();
    loadStatus();
    loadApprovals();
    loadGrants();
    loadUsage();
  }

  // signedIn names who is deciding: the API calls a bearer-token session "token".
  function signedIn(user) {
    if (!user) return '';
    return user === 'token' ? 'signed in with the admin token' : 'signed in as ' + user;
  }

  // ---- status -------------------------------------------------------------------------

  async function loadStatus() {
    if (!state.started) return;
    try {
      const s = await api('GET', '/api/status');
      renderStatus(s);
    } catch (e) {
      if (e.status !== 401) setBadge($('ready'), 'unreachable', 'bad');
    }
  }

  function setBadge(b, text, kind) {
    b.textContent = text;
    b.className = 'badge' + (kind ? ' ' + kind : '');
  }

  function renderStatus(s) {
    const ready = s.ready && typeof s.ready === 'object' ? s.ready : {};
    const st = str(ready.status) || 'unknown';
    setBadge($('ready'), st, st === 'ready' ? 'ok' : st === 'degraded' ? 'warn' : 'bad');
    const rev = str(s.policy_revision);
    state.revision = rev;
    $('revision').textContent = rev ? 'policy ' + rev : 'no policy';
    $('revision').title = 'Policy revision: ' + (rev || 'none loaded');
    if (s.user) $('user').textContent = signedIn(str(s.user));
    const dl = $('ready-details');
    dl.replaceChildren();
    const add = (k, v) => dl.append(el('dt', { text: k }), el('dd', { text: v }));
    add('status', st);
    add('policy', rev || str(ready.policy) || 'none loaded');
    if (ready.policy_reload_error) add('reload error', str(ready.policy_reload_error));
    const names = Array.isArray(ready.credentials_ready) ? ready.credentials_ready.map(str) : [];
    add('credentials', names.length ? names.join(', ') : 'none ready');
    for (const [key, label] of [['credentials', 'unavailable'], ['credentials_stale', 'stale']]) {
      const m = ready[key];
      if (m && typeof m === 'object') {
        for (const [name, why] of Object.entries(m)) add(label + ': ' + name, str(why));
      }
    }
  }

  // ---- pending approvals --------------------------------------------------------------

  function scheduleReload() {
    if (state.reloadTimer) return;
    state.reloadTimer = setTimeout(() => {
      state.reloadTimer = 0;
      loadApprovals();
      loadGrants();
    }, 150);
  }

  async function loadApprovals() {
    if (!state.started) return;
    let r;
    const seq = ++state.approvalsSeq;
    try {
      r = await api('GET', '/api/approvals');
    } catch (e) {
      if (e.status !== 401) toast('Approvals: ' + e.message, true);
      return;
    }
    if (seq !== state.approvalsSeq) return; // a newer load is under way
    const list = Array.isArray(r.pending) ? r.pending : [];
    state.recent = Array.isArray(r.recent) ? r.recent : [];
    drawRecent();
    const seen = new Set();
    const box = $('pending');
    for (const p of list) {
      const id = str(p.id);
      if (!id || state.resolved.has(id)) continue;
      seen.add(id);
      if (!state.pending.has(id)) {
        const entry = pendingCard(p);
        state.pending.set(id, entry);
        box.append(entry.card);
        noteAgent(str(p.agent));
      }
    }
    for (const [id, entry] of state.pending) {
      if (!seen.has(id)) {
        entry.card.remove();
        state.pending.delete(id);
      } else {
        entry.history.replaceChildren(...historyItems(entry.p));
        entry.historyBox.hidden = !entry.history.childElementCount;
      }
    }
    updatePendingCount();
    tick();
    focusLinked();
  }

  // decidedText says how a held request ended, in words.
  function decidedText(d) {
    const words = {
      approved: 'approved', denied: 'denied', timeout: 'nobody answered in time',
      withdrawn: 'withdrawn by the agent', interrupted: 'interrupted by a restart',
    };
    let t = words[str(d.state)] || str(d.state);
    if (d.by) t += ' by ' + str(d.by);
    if (str(d.state) === 'approved' && d.scope) t += ' (' + str(d.scope) + ')';
    if (d.comment) t += ' “' + str(d.comment) + '”';
    return t;
  }

  function decidedItem(d, withAgent, sameHost) {
    const when = clock(d.decided);
    return el('li', { class: 'decided ' + str(d.state) + (sameHost ? ' same-host' : ''), 'data-id': str(d.id) },
      el('span', { class: 't', text: when }),
      el('span', { class: 'o ' + str(d.state), text: decidedText(d) }),
      el('span', { class: 'req mono' },
        withAgent ? el('span', { class: 'who', text: str(d.agent) + ' ' }) : null,
        (str(d.method) || 'CONNECT') + ' ' + target(d)));
  }

  // drawRecent lists the held requests decided lately, including those decided before this
  // page was opened.
  function drawRecent() {
    const items = state.recent.slice(0, RECENT_SHOWN).map((d) => decidedItem(d, true, false));
    $('recent').replaceChildren(...items);
    $('recent-count').textContent = String(state.recent.length);
    $('recent-empty').hidden = items.length > 0;
  }

  // historyItems are the agent's last questions before p, and how each was decided: what an
  // approver weighs a new question against. Those to p's host are marked.
  function historyItems(p) {
    const agent = str(p.agent);
    return state.recent.filter((d) => str(d.agent) === agent && str(d.id) !== str(p.id))
      .slice(0, HISTORY_SHOWN)
      .map((d) => decidedItem(d, false, str(d.host) === str(p.host)));
  }

  // focusLinked brings the card a link names (#approval-ID, as the webhook's message links)
  // into view, once.
  function focusLinked() {
    const h = decodeURIComponent(location.hash.slice(1));
    if (!h.startsWith('approval-') || state.focused === h) return;
    const entry = state.pending.get(h.slice('approval-'.length));
    if (!entry) return;
    state.focused = h;
    entry.card.classList.add('linked');
    entry.card.scrollIntoView({ block: 'start' });
    entry.approve.focus({ preventScroll: true });
  }

  function updatePendingCount() {
    const n = state.pending.size;
    $('pending-count').textContent = String(n);
    $('pending-count').classList.toggle('some', n > 0);
    $('pending-empty').hidden = n > 0;
    document.title = (n > 0 ? '(' + n + ') ' : '') + 'capbroker console';
  }

  function target(p) {
    const host = str(p.host).includes(':') ? '[' + str(p.host) + ']' : str(p.host); // IPv6
    if (str(p.phase) === 'connect') return host + (p.port ? ':' + p.port : '');
    let t = host;
    const port = Number(p.port);
    if (port && !((p.scheme === 'https' && port === 443) || (p.scheme === 'http' && port === 80))) t += ':' + port;
    return t + str(p.path);
  }

  function defaultPrefix(path) {
    const p = str(path) || '/';
    const i = p.lastIndexOf('/');
    return i >= 0 ? p.slice(0, i + 1) : '/';
  }

  let cardSeq = 0;
  function pendingCard(p) {
    const id = str(p.id);
    const n = ++cardSeq;
    const scopes = Array.isArray(p.scopes) && p.scopes.length ? p.scopes.map(str) : ['once', 'agent', 'always'];
    const expiresEl = el('span', { class: 'expires' });
    const card = el('article', { class: 'card pending', 'data-id': id },
      el('h3', { class: 'mono' }, el('span', { text: str(p.method) || 'CONNECT' }), ' ', el('span', { text: target(p) })),
      el('div', { class: 'meta' },
        el('span', { text: 'agent ' + str(p.agent) }),
        p.source_ip ? el('span', { text: 'from ' + str(p.source_ip) }) : null,
        p.phase ? el('span', { text: 'phase ' + str(p.phase) }) : null,
        p.instance ? el('span', { class: 'instance', text: 'held on ' + str(p.instance) }) : null,
        expiresEl),
      p.reason ? el('p', { class: 'reason', text: str(p.reason) }) : null,
      credentialsLine(p),
      details(p));
    const history = el('ol', { class: 'history' }, ...historyItems(p));
    const historyBox = el('div', { class: 'history-box', hidden: !history.childElementCount },
      el('h4', { text: 'This agent asked before' }), history);
    card.append(historyBox);

    // Scope choice: radio buttons (big targets), and the fields of the wider scopes.
    const radios = {};
    const fs = el('fieldset', { class: 'scopes' }, el('legend', { text: 'Approve for' }));
    const labels = {
      once: 'This request only',
      agent: 'This agent, for a while',
      always: 'Always, until revoked',
    };
    for (const s of ['once', 'agent', 'always']) {
      if (!scopes.includes(s)) continue;
      const r = el('input', { type: 'radio', name: 'scope-' + n, value: s, id: 'scope-' + n + '-' + s });
      radios[s] = r;
      fs.append(el('label', { class: 'scope', htmlFor: r.id }, r, el('span', { text: labels[s] })));
    }
    const first = scopes.includes('once') ? 'once' : scopes[0];
    if (radios[first]) radios[first].checked = true;

    const duration = el('select', { 'aria-label': 'Duration', class: 'duration' });
    for (const [v, t] of [['15m', '15 minutes'], ['30m', '30 minutes'], ['1h', '1 hour'], ['4h', '4 hours'], ['24h', '24 hours']]) {
      duration.append(el('option', { value: v, text: t, selected: v === '30m' }));
    }
    const method = el('input', { type: 'text', class: 'method mono', value: str(p.method), placeholder: 'any method', 'aria-label': 'Method (empty: any)', autocapitalize: 'characters', spellcheck: false });
    const prefix = el('input', { type: 'text', class: 'prefix mono', value: defaultPrefix(p.path), placeholder: '/', 'aria-label': 'Path prefix', autocapitalize: 'none', spellcheck: false });
    const durLabel = el('label', null, 'Duration', duration);
    // A connect-phase question is about a host: there is no method or path to narrow to yet.
    const connect = str(p.phase) === 'connect';
    const fields = el('div', { class: 'scope-fields' },
      durLabel,
      connect ? null : el('label', null, 'Method', method),
      connect ? null : el('label', null, 'Path prefix', prefix));
    const alwaysNote = el('p', { class: 'always-note', text: 'Always: every matching request from now on, until the grant is revoked.' });
    fs.append(fields, alwaysNote);
    const comment = el('input', { type: 'text', class: 'comment', placeholder: 'Comment (optional)', 'aria-label': 'Comment', maxLength: 500 });

    const approve = el('button', { type: 'button', class: 'approve', text: 'Approve' });
    const deny = el('button', { type: 'button', class: 'deny', text: 'Deny' });
    const scopeNow = () => {
      for (const [s, r] of Object.entries(radios)) if (r.checked) return s;
      return 'once';
    };
    const sync = () => {
      const s = scopeNow();
      fields.hidden = s === 'once';
      durLabel.hidden = s !== 'agent';
      alwaysNote.hidden = s !== 'always';
    };
    for (const r of Object.values(radios)) r.addEventListener('change', sync);
    sync();

    const busy = (b) => { approve.disabled = b; deny.disabled = b; };
    approve.addEventListener('click', async () => {
      const s = scopeNow();
      const body = { scope: s, comment: comment.value };
      if (s !== 'once') {
        // The API reads "" as the held request's own method and "*" as any method.
        const m = method.value.trim().toUpperCase();
        body.method = connect || m === '' ? '*' : m;
        body.path_prefix = connect ? '' : prefix.value.trim();
        if (s === 'agent') body.duration = duration.value;
      }
      busy(true);
      try {
        const r = await api('POST', '/api/approvals/' + encodeURIComponent(id) + '/approve', body);
        resolved(id);
        toast(r && r.grant ? 'Approved; grant added' : 'Approved');
        loadGrants();
      } catch (e) {
        busy(false);
        failed('Approve', e);
      }
    });
    deny.addEventListener('click', async () => {
      busy(true);
      try {
        await api('POST', '/api/approvals/' + encodeURIComponent(id) + '/deny', { comment: comment.value });
        resolved(id);
        toast('Denied');
      } catch (e) {
        busy(false);
        failed('Deny', e);
      }
    });

    card.append(fs, el('label', null, 'Comment', comment), el('div', { class: 'actions' }, approve, deny));
    const created = Date.parse(str(p.created));
    const expires = Date.parse(str(p.expires));
    return { p, card, expiresEl, expires, created, approve, history, historyBox };
  }

  // credentialsLine says which credentials approving attaches: what the person lets the
  // request carry, in plain sight rather than in the details.
  function credentialsLine(p) {
    if (str(p.phase) === 'connect') return null;
    const names = Array.isArray(p.credentials) ? p.credentials.map(str) : [];
    return el('p', { class: 'credentials' + (names.length ? ' some' : '') },
      names.length ? 'Approving attaches the credentials: ' + names.join(', ') : 'Approving attaches no credentials');
  }

  function details(p) {
    const d = el('details', { class: 'req-details', open: window.matchMedia('(min-width: 900px)').matches });
    d.append(el('summary', { text: 'Request details' }));
    const dl = el('dl', { class: 'kv' });
    const add = (k, v) => dl.append(el('dt', { text: k }), el('dd', { text: v }));
    add('scheme', str(p.scheme));
    // Every value of every query parameter, as the upstream gets them (secrets scrubbed).
    const q = p.query && typeof p.query === 'object' ? p.query : {};
    for (const name of Object.keys(q).sort()) {
      const vs = Array.isArray(q[name]) ? q[name].map(str) : [str(q[name])];
      add('query ' + name, vs.map((v) => JSON.stringify(v)).join(', '));
    }
    const h = p.headers && typeof p.headers === 'object' ? p.headers : {};
    for (const name of Object.keys(h).sort()) add(name, Array.isArray(h[name]) ? h[name].map(str).join(', ') : str(h[name]));
    d.append(dl);
    const size = Number(p.body_size) || 0;
    if (size > 0 || p.body_preview) {
      const preview = str(p.body_preview);
      const cut = p.body_truncated === true;
      d.append(el('div', { class: 'body-label' + (cut ? ' cut' : ''),
        text: 'Body: ' + size + ' bytes' + (cut ? ' — cut: only its start is shown below, the rest is sent too' : '') }),
        el('pre', { class: 'body', text: preview }));
    }
    return d;
  }

  function resolved(id) {
    state.resolved.add(id);
    if (state.resolved.size > 1000) state.resolved.delete(state.resolved.values().next().value);
    const entry = state.pending.get(id);
    if (entry) entry.card.remove();
    state.pending.delete(id);
    updatePendingCount();
  }

  function failed(what, e) {
    if (e.status === 404 || e.status === 409 || e.status === 410) {
      toast(what + ': this request is no longer waiting (' + e.message + ')', true);
      scheduleReload();
      return;
    }
    toast(what + ' failed: ' + e.message, true);
  }

  function fmtLeft(ms) {
    const s = Math.max(0, Math.round(ms / 1000));
    if (s >= 3600) return Math.floor(s / 3600) + 'h ' + Math.floor((s % 3600) / 60) + 'm';
    if (s >= 60) return Math.floor(s / 60) + 'm ' + String(s % 60).padStart(2, '0') + 's';
    return s + 's';
  }

  // tick updates the countdowns; an approval past its time is reloaded (the broker answered it).
  function tick() {
    const now = Date.now() + state.skew;
    let expired = false;
    for (const entry of state.pending.values()) {
      if (Number.isNaN(entry.expires)) { entry.expiresEl.textContent = ''; continue; }
      // (The clock skew is known to a second only: never show more than the whole timeout.)
      let left = entry.expires - now;
      if (!Number.isNaN(entry.created)) left = Math.min(left, entry.expires - entry.created);
      entry.expiresEl.textContent = left > 0 ? 'times out in ' + fmtLeft(left) : 'timed out';
      entry.expiresEl.classList.toggle('soon', left < 30000);
      if (left < -1000) expired = true;
    }
    if (expired) scheduleReload();
  }

  // ---- grants -------------------------------------------------------------------------

  async function loadGrants() {
    if (!state.started) return;
    // Only the newest load is drawn: an older answer arriving late (a refresh that started
    // before a revoke) would put a revoked grant back on the page.
    const seq = state.grantsSeq = (state.grantsSeq || 0) + 1;
    let r;
    try {
      r = await api('GET', '/api/grants');
    } catch (e) {
      if (e.status !== 401 && seq === state.grantsSeq) toast('Grants: ' + e.message, true);
      return;
    }
    if (seq !== state.grantsSeq) return;
    const list = Array.isArray(r.grants) ? r.grants : [];
    // Keyed update: an item stays the same element while its grant lives (a button under a
    // finger must not be swapped for a copy); only its text is refreshed.
    const ul = $('grants');
    const old = new Map([...ul.children].map((li) => [li.dataset.id, li]));
    const items = list.map((g) => {
      const fresh = grantItem(g);
      const li = old.get(str(g.id));
      if (!li) return fresh;
      li.querySelector('.what').replaceWith(fresh.querySelector('.what'));
      return li;
    });
    items.forEach((li, i) => { if (ul.children[i] !== li) ul.insertBefore(li, ul.children[i] || null); });
    while (ul.children.length > items.length) ul.lastElementChild.remove();
    $('grants-count').textContent = String(list.length);
    $('grants-empty').hidden = list.length > 0;
  }

  // grantTarget is where a grant lets requests go: its scheme, host and port exactly (a grant
  // covers no other port), and its path prefix.
  function grantTarget(g) {
    const scheme = str(g.scheme);
    const port = Number(g.port) ? ':' + Number(g.port) : '';
    return (scheme ? scheme + '://' : '') + str(g.host) + port + (str(g.path_prefix) || (scheme ? '/' : ''));
  }

  function grantItem(g) {
    const id = str(g.id);
    const always = str(g.kind) === 'always' || !g.expires;
    let when = 'always';
    if (!always) {
      const exp = Date.parse(str(g.expires));
      when = Number.isNaN(exp) ? 'until ' + str(g.expires) : 'expires in ' + fmtLeft(exp - Date.now() - state.skew);
    }
    const sub = [when];
    if (g.created_by) sub.push('by ' + str(g.created_by));
    if (g.comment) sub.push('“' + str(g.comment) + '”');
    const revoke = el('button', { type: 'button', class: 'revoke', text: 'Revoke' });
    revoke.addEventListener('click', async () => {
      revoke.disabled = true;
      try {
        await api('DELETE', '/api/grants/' + encodeURIComponent(id));
        toast('Grant revoked');
        loadGrants();
      } catch (e) {
        revoke.disabled = false;
        toast('Revoke failed: ' + e.message, true);
        if (e.status === 404) loadGrants();
      }
    });
    return el('li', { 'data-id': id },
      el('div', { class: 'what' },
        el('div', { class: 'mono' },
          el('strong', { text: str(g.agent) || 'any agent' }), ' ',
          el('span', { text: (str(g.method) || 'any method') + ' ' + grantTarget(g) })),
        el('div', { class: 'sub', text: sub.join(' · ') })),
      revoke);
  }

  // ---- usage (budgets) ---------------------------------------------------------------

  // scheduleUsage reloads the usage panel soon, at most once every USAGE_MS: a broker serving
  // many metered calls a second costs the admin API one call a second from this page.
  function scheduleUsage() {
    if (state.usageTimer) return;
    const wait = Math.max(0, state.usageAt + USAGE_MS - Date.now());
    state.usageTimer = setTimeout(() => { state.usageTimer = 0; loadUsage(); }, wait);
  }

  async function loadUsage() {
    if (!state.started) return;
    state.usageAt = Date.now();
    const seq = ++state.usageSeq;
    let r;
    try {
      r = await api('GET', '/api/usage');
    } catch (e) {
      if (e.status === 401 || seq !== state.usageSeq) return;
      const empty = $('usage-empty');
      empty.textContent = 'Usage unavailable: ' + e.message;
      empty.hidden = false;
      empty.classList.add('error');
      return;
    }
    if (seq !== state.usageSeq) return; // a newer load is under way
    const list = Array.isArray(r.usage) ? r.usage.filter((l) => l && typeof l === 'object') : [];
    const ul = $('usage');
    ul.replaceChildren(...list.map(usageItem));
    const spent = ul.querySelectorAll('li.spent').length;
    $('usage-count').textContent = spent ? list.length + ' · ' + spent + ' spent' : String(list.length);
    $('usage-count').classList.toggle('spent', spent > 0);
    const empty = $('usage-empty');
    empty.classList.remove('error');
    empty.textContent = 'No budgets: the policy\'s data declares none.';
    empty.hidden = list.length > 0;
  }

  // amount shows a counter in its unit: cost in dollars, requests and tokens as counts.
  function amount(v, unit) {
    const n = Number(v);
    if (!Number.isFinite(n)) return str(v);
    if (unit === 'cost' && n > 0 && n < 0.0001) return '< $0.0001';
    if (unit === 'cost') return '$' + (n >= 100 ? n.toFixed(0) : n >= 1 ? n.toFixed(2) : n.toFixed(4).replace(/0+$/, '').replace(/\.$/, ''));
    return n.toLocaleString('en-US');
  }

  function usageItem(l) {
    const u = l.usage && typeof l.usage === 'object' ? l.usage : {};
    const unit = str(u.unit);
    const used = Number(u.used) || 0;
    const limit = Number(u.limit) || 0;
    const spent = Number(u.remaining) <= 0;
    const scope = [];
    if (u.provider) scope.push(str(u.provider));
    if (u.model) scope.push(str(u.model));
    const sub = [str(u.window) ? 'per ' + str(u.window) : '', 'remaining ' + amount(u.remaining, unit)];
    const resets = Date.parse(str(u.resets_at));
    if (!Number.isNaN(resets)) sub.push('resets in ' + fmtLeft(resets - Date.now() - state.skew));
    const meter = el('meter', { min: 0, max: Math.max(limit, 1), value: Math.min(used, Math.max(limit, 1)),
      low: limit * 0.75, high: limit * 0.9, optimum: 0, 'aria-label': str(l.budget) + ' used' });
    return el('li', { class: spent ? 'spent' : '', 'data-budget': str(l.budget), 'data-agent': str(l.agent) },
      el('div', { class: 'head' },
        el('strong', { class: 'mono', text: str(l.budget) }),
        el('span', { class: 'who', text: l.agent ? 'agent ' + str(l.agent) : 'all agents' }),
        scope.length ? el('span', { class: 'who', text: scope.join(' ') }) : null,
        spent ? el('span', { class: 'badge bad', text: 'spent' }) : null),
      el('div', { class: 'used', text: amount(u.used, unit) + ' of ' + amount(u.limit, unit) + (unit === 'cost' ? '' : ' ' + unit) }),
      meter,
      el('div', { class: 'sub', text: sub.filter(Boolean).join(' · ') }));
  }

  // ---- live decisions -----------------------------------------------------------------

  function startStream() {
    stopStream();
    const es = new EventSource('/api/events');
    state.events = es;
    setBadge($('stream'), 'connecting', 'warn');
    es.addEventListener('open', () => {
      state.retry = 0;
      setBadge($('stream'), state.paused ? 'paused' : 'live', state.paused ? 'warn' : 'ok');
      scheduleReload(); // anything missed while away
    });
    es.addEventListener('decision', (m) => {
      let ev;
      try { ev = JSON.parse(m.data); } catch (_) { return; }
      if (!ev || typeof ev !== 'object') return;
      const rid = str(ev.request_id);
      if (rid) {
        if (state.seenDecisions.has(rid)) return; // replayed on reconnect: drawn already
        state.seenDecisions.add(rid);
        if (state.seenDecisions.size > 4 * MAX_ROWS) state.seenDecisions.delete(state.seenDecisions.values().next().value);
      }
      state.queue.push(ev);
      if (state.queue.length > MAX_ROWS) state.queue.splice(0, state.queue.length - MAX_ROWS);
      if (!state.frame) state.frame = requestAnimationFrame(flush);
    });
    es.addEventListener('approval', () => scheduleReload());
    es.addEventListener('grant', () => { scheduleReload(); loadStatus(); }); // "always" changes the policy
    es.addEventListener('dropped', (m) => {
      let n = 0;
      try { n = Number(JSON.parse(m.data).count) || 0; } catch (_) { n = 0; }
      state.dropped += n;
      const d = $('dropped');
      d.textContent = state.dropped + ' decision' + (state.dropped === 1 ? '' : 's') +
        ' were not shown: this page fell behind the stream (the broker served them all; the audit log has every one).';
      d.hidden = false;
    });
    es.addEventListener('error', () => {
      if (es.readyState === EventSource.CLOSED) {
        // The browser gave up (an HTTP error such as 401): ask the session, then retry.
        setBadge($('stream'), 'offline', 'bad');
        state.events = null;
        const wait = Math.min(30000, 1000 * Math.pow(2, state.retry++));
        setTimeout(async () => {
          if (!state.started) return;
          try {
            await api('GET', '/api/session');
            if (state.started && !state.events) startStream();
          } catch (_) { /* showLogin ran on 401; otherwise the next tick retries */
            if (state.started && !state.events) setTimeout(startStream, wait);
          }
        }, wait);
      } else {
        setBadge($('stream'), 'reconnecting', 'warn');
      }
    });
  }

  function stopStream() {
    if (state.events) state.events.close();
    state.events = null;
  }

  function outcomeOf(ev) {
    return str(ev.decision) || 'unknown';
  }

  function matches(ev) {
    const a = $('filter-agent').value;
    const o = $('filter-outcome').value;
    if (a && str(ev.agent) !== a) return false;
    if (!o) return true;
    if (o === 'approval') return !!ev.approval;
    return outcomeOf(ev) === o;
  }

  function noteAgent(a) {
    if (!a || state.agents.has(a) || state.agents.size >= MAX_AGENTS) return;
    state.agents.add(a);
    const sel = $('filter-agent');
    const opt = el('option', { value: a, text: a });
    // keep the options sorted after "all agents"
    let before = null;
    for (let i = 1; i < sel.options.length; i++) {
      if (sel.options[i].value > a) { before = sel.options[i]; break; }
    }
    sel.insertBefore(opt, before);
  }

  function flush() {
    state.frame = 0;
    const batch = state.queue;
    state.queue = [];
    let metered = false;
    for (const ev of batch) {
      state.rows.push(ev);
      noteAgent(str(ev.agent));
      if (ev.llm || ev.budget) metered = true;
    }
    if (metered) scheduleUsage(); // a metered call or a budget's refusal moved a counter
    // Decisions name the policy revision that made them: a reload shows at once.
    const last = batch.length ? str(batch[batch.length - 1].policy_revision) : '';
    if (last && last !== state.revision) loadStatus();
    if (state.rows.length > MAX_ROWS) state.rows.splice(0, state.rows.length - MAX_ROWS);
    if (state.paused) return;
    const frag = document.createDocumentFragment();
    for (let i = batch.length - 1; i >= Math.max(0, batch.length - MAX_ROWS); i--) {
      if (matches(batch[i])) frag.append(row(batch[i]));
    }
    const list = $('live');
    list.prepend(frag);
    while (list.childElementCount > MAX_ROWS) list.lastElementChild.remove();
    $('live-empty').hidden = list.childElementCount > 0;
  }

  function redraw() {
    const list = $('live');
    const frag = document.createDocumentFragment();
    for (let i = state.rows.length - 1; i >= 0; i--) {
      if (matches(state.rows[i])) frag.append(row(state.rows[i]));
    }
    list.replaceChildren(frag);
    $('live-empty').hidden = list.childElementCount > 0;
    $('live-empty').textContent = state.rows.length ? 'No decision matches the filters.' : 'Waiting for decisions…';
  }

  function clock(t) {
    const d = new Date(str(t));
    if (Number.isNaN(d.getTime())) return '';
    return d.toLocaleTimeString([], { hour12: false });
  }

  function row(ev) {
    const out = outcomeOf(ev);
    const status = ev.status ? ' ' + ev.status : '';
    const connect = str(ev.phase) === 'connect';
    const req = (connect ? 'CONNECT' : str(ev.method)) + ' ' + target(ev);
    const detail = el('div', { class: 'detail' });
    if (ev.reason) detail.append(el('span', { text: str(ev.reason) }));
    const creds = Array.isArray(ev.credentials) ? ev.credentials.map(str).filter(Boolean) : [];
    if (creds.length) detail.append(detail.childNodes.length ? ' · ' : '', el('span', { class: 'creds', text: 'credentials: ' + creds.join(', ') }));
    if (ev.approval && typeof ev.approval === 'object') {
      const a = ev.approval;
      const words = {
        approved: 'approved', denied: 'denied', timeout: 'nobody answered in time',
        withdrawn: 'withdrawn by the agent', interrupted: 'interrupted by a restart', granted: 'covered by a grant',
      };
      let t = words[str(a.outcome)] || ('asked a person' + (a.outcome ? ': ' + str(a.outcome) : ''));
      if (a.by) t += ' by ' + str(a.by);
      if (a.scope && str(a.outcome) !== 'granted') t += ' (' + str(a.scope) + ')';
      if (a.grant) t += ' ' + str(a.grant);
      if (a.comment) t += ' “' + str(a.comment) + '”';
      detail.append(detail.childNodes.length ? ' · ' : '', el('span', { class: 'approval', text: t }));
    }
    if (ev.llm && typeof ev.llm === 'object') {
      const l = ev.llm;
      let t = (str(l.model) || str(l.provider) || 'LLM call') + ': ';
      if (l.usage_reported === false) t += 'usage not reported';
      else {
        t += amount(l.tokens_in, 'tokens') + ' in, ' + amount(l.tokens_out, 'tokens') + ' out';
        if (Number(l.tokens_cached) > 0) t += ' (' + amount(l.tokens_cached, 'tokens') + ' cached)';
      }
      if (Number(l.cost) > 0) t += ', ' + amount(l.cost, 'cost');
      detail.append(detail.childNodes.length ? ' · ' : '', el('span', { class: 'llm', text: t }));
    }
    if (ev.budget) detail.append(detail.childNodes.length ? ' · ' : '', el('span', { class: 'budget', text: 'budget ' + str(ev.budget) }));
    if (ev.would_deny) detail.append(detail.childNodes.length ? ' · ' : '', el('span', { text: 'would deny (monitor mode)' }));
    return el('li', { class: connect ? 'connect' : '' },
      el('span', { class: 't', text: clock(ev.time) }),
      el('span', { class: 'o ' + out, text: out + status }),
      el('span', { class: 'req mono' }, el('span', { class: 'who', text: str(ev.agent) + ' ' }), req),
      detail.childNodes.length ? detail : null);
  }

  // ---- wiring -------------------------------------------------------------------------

  document.addEventListener('DOMContentLoaded', () => {
    $('login-form').addEventListener('submit', login);
    $('logout').addEventListener('click', logout);
    $('filter-agent').addEventListener('change', redraw);
    $('filter-outcome').addEventListener('change', redraw);
    $('pause').addEventListener('click', () => {
      state.paused = !state.paused;
      $('pause').textContent = state.paused ? 'Resume' : 'Pause';
      $('pause').setAttribute('aria-pressed', String(state.paused));
      if (state.events) setBadge($('stream'), state.paused ? 'paused' : 'live', state.paused ? 'warn' : 'ok');
      if (!state.paused) redraw();
    });
    $('clear').addEventListener('click', () => {
      state.rows = [];
      state.dropped = 0;
      $('dropped').hidden = true;
      redraw();
    });
    window.addEventListener('hashchange', focusLinked);
    setInterval(tick, 1000);
    setInterval(() => { loadApprovals(); loadGrants(); loadUsage(); }, REFRESH_MS); // usage: windows reset
    setInterval(loadStatus, STATUS_MS);
    boot();
  });
})();
