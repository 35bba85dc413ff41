package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// TestConsoleUsage: the console's Usage panel shows a requests budget's counter from
// GET /api/usage and follows it as metered decisions arrive (not only on its 10 s refresh);
// the live list shows a metered call's model, tokens and cost, and a refusal's budget. curl,
// as the agent, spends the budget through the real broker against an LLM stand-in.
func TestConsoleUsage(t *testing.T) {
	token := randHex(16)
	e := newEnv(t, envOpts{policy: llmPolicy, handler: &llmStandIn{asked: map[string]bool{}},
		policyFiles: map[string]string{"budgets.json": `{
  "budgets": {"agent-requests": {"agent": "coder-1", "requests": 2, "window": "day"}},
  "prices": {"gpt-json": {"input": 1000000, "output": 2000000, "cached": 500000}}
}`},
		admin: "token_env: CAPBROKER_ADMIN_TOKEN",
		env:   []string{"CAPBROKER_ADMIN_TOKEN=" + token},
		extraConfig: `llm:
  openai_compatible:
    - {name: openai-local, hosts: ["127.0.0.1"], path_prefix: /api/custom/v1}
`})
	ctx := newBrowser(t)
	login(t, ctx, "http://"+e.broker.adminAddr, token)

	const item = `#usage li[data-budget="agent-requests"][data-agent=""]`
	text := func(sel string) string {
		return eval[string](t, ctx, `(document.querySelector('`+sel+`') || {textContent: ''}).textContent`)
	}
	waitJS(t, ctx, "the budget in the Usage panel", `document.querySelector('`+item+`')`)
	if got := text(item); !strings.Contains(got, "0 of 2 requests") || !strings.Contains(got, "remaining 2") ||
		!strings.Contains(got, "per day") || strings.Contains(got, "spent") {
		t.Errorf("the unspent budget is shown as %q", got)
	}
	call := func() string {
		out, err := e.curl("-i", "-H", "Content-Type: application/json", "--data", `{"model":"gpt-json","messages":[{"role":"user","content":"hi"}]}`,
			e.url("/api/custom/v1/chat/completions"))
		if err != nil {
			t.Fatalf("curl: %v\n%s", err, out)
		}
		return out
	}
	// soon waits for the panel after a decision row appears: well within the panel's 10 s
	// refresh, so only the reload a metered decision triggers passes.
	soon := func(what, expr string) {
		t.Helper()
		deadline := time.Now().Add(3 * time.Second)
		for !eval[bool](t, ctx, "!!("+expr+")") {
			if time.Now().After(deadline) {
				t.Fatalf("the Usage panel did not show %s within 3s of the decision: %q", what, text("#usage-panel"))
			}
			time.Sleep(25 * time.Millisecond)
		}
	}

	for i := 1; i <= 2; i++ {
		if out := call(); !strings.HasPrefix(out, "HTTP/1.1 200") && !strings.HasPrefix(out, "HTTP/2 200") {
			t.Fatalf("call %d: %s", i, out)
		}
		// gpt-json reports 11 tokens in (2 cached), 7 out: 9*1 + 2*0.5 + 7*2 = $24.
		waitJS(t, ctx, fmt.Sprintf("metered call %d in the live list", i), fmt.Sprintf(`document.querySelectorAll('#live .detail .llm').length === %d`, i))
		soon(fmt.Sprintf("%d of 2", i), fmt.Sprintf(`document.querySelector('%s').textContent.includes('%d of 2 requests')`, item, i))
	}
	if got := eval[string](t, ctx, `document.querySelector('#live li .detail .llm').textContent`); got != "gpt-json: 11 in, 7 out (2 cached), $24.00" {
		t.Errorf("a metered call in the live list: %q", got)
	}

	out := call()
	if !strings.Contains(out, " 429") || !strings.Contains(out, "agent-requests") {
		t.Fatalf("the call over the budget: %s", out)
	}
	waitJS(t, ctx, "the budget's refusal in the live list", `[...document.querySelectorAll('#live li')].some(li => li.querySelector('.o.deny') && li.querySelector('.detail .budget') &&
		li.querySelector('.detail .budget').textContent === 'budget agent-requests' && li.textContent.includes('429'))`)
	soon("the budget spent", `document.querySelector('`+item+`.spent')`)
	if got := text(item); !strings.Contains(got, "2 of 2 requests") || !strings.Contains(got, "remaining 0") || !strings.Contains(got, "spent") {
		t.Errorf("the spent budget is shown as %q", got)
	}
	if got := text("#usage-count"); got != "1 · 1 spent" {
		t.Errorf("usage count %q", got)
	}

	// Usable on a phone with the panel filled: nothing wider than the screen.
	do(t, ctx, chromedp.EmulateViewport(375, 667, chromedp.EmulateScale(1)))
	waitJS(t, ctx, "the layout", "window.innerWidth === 375")
	if w := eval[int](t, ctx, `document.documentElement.scrollWidth`); w > 375 {
		t.Errorf("the page is %dpx wide on a 375px screen", w)
	}
	e.assertNoCanaryLeaked()
}
