package dashboard

// A small driver for the browser test, on chromedp: locators that are
// JavaScript expressions, actions that wait for their element the way a
// person would (visible, enabled, not covered), and the events of the tab
// (console errors and warnings, uncaught exceptions, failed requests and
// HTTP errors) collected as problems.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/cdproto/input"
	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
)

// Timeouts are generous: `make test` runs the browser test beside other
// suites on two cores.
const (
	actionTimeout = 60 * time.Second // one action: find the element, act
	callTimeout   = 60 * time.Second // one protocol call
	pollEvery     = 200 * time.Millisecond
)

// locator is a JavaScript expression that evaluates, with the helpers of
// pageHelpers in scope as W, to an array of elements. It is looked up again
// each time it is used, so it follows the page as it re-renders.
type locator string

// jsString quotes v as a JavaScript literal.
func jsString(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// css is every element of the document that matches the selector.
func css(sel string) locator { return locator("W.css([document], " + jsString(sel) + ")") }

// css is every element inside l's elements that matches the selector.
func (l locator) css(sel string) locator {
	return locator("W.css(" + string(l) + ", " + jsString(sel) + ")")
}

// first is l's first element.
func (l locator) first() locator { return locator("(" + string(l) + ").slice(0, 1)") }

// visible is l's elements that are visible.
func (l locator) visible() locator { return locator("(" + string(l) + ").filter(W.visible)") }

// label is the elements inside l's elements labelled text: by a <label>,
// aria-labelledby or aria-label. Without exact, text matches any part of the
// label, ignoring case.
func (l locator) label(text string, exact bool) locator {
	return locator(fmt.Sprintf("W.byLabel(%s, %s, %t)", l, jsString(text), exact))
}

// role is the elements inside l's elements that have the ARIA role and whose
// accessible name contains name (ignoring case), leaving out those hidden
// from assistive technology.
func (l locator) role(role, name string) locator {
	return locator(fmt.Sprintf("W.byRole(%s, %s, %s)", l, jsString(role), jsString(name)))
}

// doc is the root of every locator.
const doc = locator("[document]")

// pageHelpers are the functions every evaluation has in scope as W.
const pageHelpers = `const W = {
  norm: (s) => String(s ?? '').replace(/\s+/g, ' ').trim(),
  css(roots, sel) {
    const out = new Set();
    for (const r of roots) for (const e of r.querySelectorAll(sel)) out.add(e);
    return [...out];
  },
  // Visible as a person sees it: a box with an area, and not visibility:hidden.
  visible(el) {
    if (!el || !el.isConnected) return false;
    const st = getComputedStyle(el);
    if (st.visibility !== 'visible') return false;
    const r = el.getBoundingClientRect();
    return r.width > 0 && r.height > 0;
  },
  hiddenFromAT(el) {
    if (!el.checkVisibility({ visibilityProperty: true })) return true;
    return !!el.closest('[aria-hidden="true"]');
  },
  textOf(ids) {
    return ids.split(/\s+/).map((id) => document.getElementById(id)?.textContent ?? '').join(' ');
  },
  labels(el) {
    const out = [];
    const by = el.getAttribute('aria-labelledby');
    if (by) out.push(W.textOf(by));
    const al = el.getAttribute('aria-label');
    if (al) out.push(al);
    if (el.labels) for (const l of el.labels) out.push(l.textContent);
    return out.map(W.norm);
  },
  matches(text, want, exact) {
    return exact ? text === want : text.toLowerCase().includes(W.norm(want).toLowerCase());
  },
  all(roots) {
    const out = new Set();
    for (const r of roots) for (const e of r.querySelectorAll('*')) out.add(e);
    return [...out];
  },
  byLabel(roots, want, exact) {
    return W.all(roots).filter((e) => W.labels(e).some((t) => W.matches(t, want, exact)));
  },
  role(el) {
    const explicit = el.getAttribute('role');
    if (explicit) return explicit.split(/\s+/)[0];
    const tag = el.localName;
    if (tag === 'button') return 'button';
    if (tag === 'input' && ['button', 'submit', 'reset', 'image'].includes(el.type)) return 'button';
    if (tag === 'select') return el.multiple || el.size > 1 ? 'listbox' : 'combobox';
    if (tag === 'input' && ['text', 'password', 'search', 'email', 'tel', 'url', ''].includes(el.type)) return 'textbox';
    if (tag === 'textarea') return 'textbox';
    if (tag === 'a' && el.hasAttribute('href')) return 'link';
    return '';
  },
  name(el) {
    const by = el.getAttribute('aria-labelledby');
    if (by) return W.norm(W.textOf(by));
    const al = el.getAttribute('aria-label');
    if (al && W.norm(al)) return W.norm(al);
    if (el.localName === 'input' && ['button', 'submit', 'reset'].includes(el.type)) return W.norm(el.value);
    if (el.labels && el.labels.length) return W.norm([...el.labels].map((l) => l.textContent).join(' '));
    return W.norm(el.textContent);
  },
  byRole(roots, role, name) {
    return W.all(roots).filter((e) => W.role(e) === role && !W.hiddenFromAT(e) && W.matches(W.name(e), name, false));
  },
  // The one element of a locator; null while there is none, an error for more.
  one(list, what) {
    if (list.length > 1) throw new Error(what + ' matches ' + list.length + ' elements');
    return list[0] ?? null;
  },
  // Where to click el, or why not yet: visible, enabled, scrolled into view
  // and not covered by another element.
  clickPoint(el) {
    if (!W.visible(el)) return { why: 'not visible' };
    if (el.disabled) return { why: 'disabled' };
    el.scrollIntoView({ block: 'center', inline: 'center', behavior: 'instant' });
    const r = el.getBoundingClientRect();
    const x = r.left + r.width / 2, y = r.top + r.height / 2;
    const hit = document.elementFromPoint(x, y);
    if (!hit || !(hit === el || el.contains(hit))) return { why: 'covered by ' + (hit ? hit.outerHTML.slice(0, 120) : 'nothing') };
    return { x, y };
  },
};`

// evalJS evaluates expr in the page, with the helpers in scope as W, awaits
// it when it is a promise, and decodes its value as JSON into out (out may be
// nil).
func (b *tab) evalJS(expr string, out any) error {
	ctx, cancel := context.WithTimeout(b.ctx, callTimeout)
	defer cancel()
	src := "(async () => {\n" + pageHelpers + "\nreturn (" + expr + ");\n})()"
	raw, err := chromedp.Run(ctx, chromedp.Evaluate[[]byte](src, chromedp.EvalAwaitPromise))
	if err != nil {
		var ex *chromedp.ExceptionError
		if errors.As(err, &ex) {
			return fmt.Errorf("evaluating %s: %w", expr, err)
		}
		return err
	}
	if out == nil || len(raw) == 0 {
		return nil
	}
	return json.Unmarshal(raw, out)
}

// tab is one page of the browser test, with what its events reported.
type tab struct {
	t   *testing.T
	ctx context.Context // the chromedp context of the tab

	mu       sync.Mutex
	problems []string
	urls     map[network.RequestID]string
}

// newTab starts chromium (headless, no sandbox) and opens a tab whose events
// feed b.problems. The browser stops when the test ends.
func newTab(t *testing.T, chromium string) *tab {
	t.Helper()
	var out lockedBuffer
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 800),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.CombinedOutput(&out),
	)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	logf := guardedLogf(t)
	b := &tab{t: t, urls: map[network.RequestID]string{}}
	ctx, cancel := chromedp.NewContext(allocCtx,
		chromedp.WithErrorf(logf),
		chromedp.WithLogf(logf),
		chromedp.WithListener(b.onEvent),
	)
	b.ctx = ctx
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
		if t.Failed() {
			if s := out.String(); s != "" {
				if len(s) > 8000 {
					s = "…" + s[len(s)-8000:]
				}
				t.Logf("chromium output:\n%s", s)
			}
		}
	})
	// The first Run starts the browser; its context must not carry a
	// timeout (the browser would stop with it), so the wait is bounded here.
	started := make(chan error, 1)
	go func() { started <- chromedp.Do(ctx) }()
	select {
	case err := <-started:
		if err != nil {
			t.Fatalf("starting %s: %v", chromium, err)
		}
	case <-time.After(2 * time.Minute):
		cancel()
		<-started
		t.Fatalf("%s did not start within 2 minutes", chromium)
	}
	return b
}

// guardedLogf logs to t until the test ends, and drops what comes later (a
// goroutine of the browser may still log while it shuts down).
func guardedLogf(t *testing.T) func(string, ...any) {
	var mu sync.Mutex
	done := false
	t.Cleanup(func() { mu.Lock(); done = true; mu.Unlock() })
	return func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		if !done {
			t.Logf("chromedp: "+format, args...)
		}
	}
}

// lockedBuffer is a bytes.Buffer safe for the writers of a process's output.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// problem records something the page should not have done.
func (b *tab) problem(format string, args ...any) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.problems = append(b.problems, fmt.Sprintf(format, args...))
}

// Problems returns what was recorded so far.
func (b *tab) Problems() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.problems...)
}

// onEvent runs in the tab's event loop, in the order of the events: it must
// return fast and send no command.
func (b *tab) onEvent(ev any) {
	switch ev := ev.(type) {
	case *runtime.EventConsoleAPICalled:
		if ev.Type == runtime.ConsoleAPICalledTypeError || ev.Type == runtime.ConsoleAPICalledTypeWarning {
			b.problem("console %s: %s", consoleType(string(ev.Type)), consoleText(ev.Args))
		}
	case *cdplog.EventEntryAdded:
		// The browser's own messages, such as "Failed to load resource".
		if e := ev.Entry; e != nil && (e.Level == cdplog.EntryLevelError || e.Level == cdplog.EntryLevelWarning) {
			b.problem("console %s: %s", consoleType(string(e.Level)), e.Text)
		}
	case *runtime.EventExceptionThrown:
		b.problem("page error: %s", exceptionText(ev.ExceptionDetails))
	case *network.EventRequestWillBeSent:
		if ev.Request != nil {
			b.mu.Lock()
			b.urls[ev.RequestID] = ev.Request.URL
			b.mu.Unlock()
		}
	case *network.EventLoadingFailed:
		b.mu.Lock()
		u := b.urls[ev.RequestID]
		b.mu.Unlock()
		// A poll the page gave up on (its own timeout) is not a fault of the
		// page; a stalled service would fail the checks.
		if strings.HasSuffix(u, "/v1/dashboard/snapshot") && strings.Contains(ev.ErrorText, "ABORTED") {
			return
		}
		why := ev.ErrorText
		if ev.BlockedReason != "" {
			why += " (blocked: " + string(ev.BlockedReason) + ")"
		}
		b.problem("request failed: %s %s", u, why)
	case *network.EventResponseReceived:
		if r := ev.Response; r != nil && r.Status >= 400 {
			path := r.URL
			if i := strings.Index(path, "://"); i >= 0 {
				path = path[i+3:]
				if j := strings.IndexByte(path, '/'); j >= 0 {
					path = path[j:]
				} else {
					path = "/"
				}
			}
			if k := strings.IndexAny(path, "?#"); k >= 0 {
				path = path[:k]
			}
			if !strings.HasPrefix(path, "/v1/") {
				b.problem("HTTP %d for %s", r.Status, path)
			}
		}
	}
}

// consoleType names a console message's type as the page sees it.
func consoleType(s string) string {
	if s == "warn" {
		return "warning"
	}
	return s
}

// consoleText is the arguments of a console call as one line.
func consoleText(args []*runtime.RemoteObject) string {
	var parts []string
	for _, a := range args {
		switch {
		case a == nil:
		case len(a.Value) > 0:
			var s string
			if json.Unmarshal(a.Value, &s) == nil {
				parts = append(parts, s)
			} else {
				parts = append(parts, string(a.Value))
			}
		case a.Description != "":
			parts = append(parts, a.Description)
		default:
			parts = append(parts, string(a.Type))
		}
	}
	return strings.Join(parts, " ")
}

// exceptionText is the message of an uncaught exception.
func exceptionText(d *runtime.ExceptionDetails) string {
	if d == nil {
		return "unknown exception"
	}
	if d.Exception != nil && d.Exception.Description != "" {
		return d.Exception.Description
	}
	return d.Text
}

// navigate loads url, waits for its load event and returns the document's
// response.
func (b *tab) navigate(url string) *network.Response {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, actionTimeout)
	defer cancel()
	resp, err := chromedp.Run(ctx, chromedp.NavigateResponse(url))
	if err != nil {
		b.t.Fatalf("GET %s: %v", url, err)
	}
	return resp
}

// header is a response header, whatever its case.
func header(r *network.Response, name string) string {
	for k, v := range r.Headers {
		if strings.EqualFold(k, name) {
			return fmt.Sprint(v)
		}
	}
	return ""
}

// waitFor polls fn every `every` until it reports done, and fails the test
// with what fn last returned when timeout passes.
func (b *tab) waitFor(what string, timeout, every time.Duration, fn func() (bool, any, error)) {
	b.t.Helper()
	end := time.Now().Add(timeout)
	var last any
	for {
		done, v, err := fn()
		if err == nil && done {
			return
		}
		if err != nil {
			last = err
		} else {
			last = v
		}
		if time.Now().After(end) || b.ctx.Err() != nil {
			if e, ok := last.(error); ok {
				b.t.Fatalf("timed out waiting for %s (last: %v)", what, e)
			}
			b.t.Fatalf("timed out waiting for %s (last: %s)", what, jsString(last))
		}
		time.Sleep(every)
	}
}

// count is how many elements l finds now.
func (b *tab) count(l locator) int {
	b.t.Helper()
	var n int
	if err := b.evalJS("("+string(l)+").length", &n); err != nil {
		b.t.Fatal(err)
	}
	return n
}

// tryInnerText is the innerText of l's one element; "" and false while there
// is none; an error when l finds more than one.
func (b *tab) tryInnerText(l locator) (string, bool, error) {
	var r struct {
		Found bool   `json:"found"`
		Text  string `json:"text"`
	}
	err := b.evalJS(fmt.Sprintf("((el) => el ? { found: true, text: el.innerText } : { found: false })(W.one(%s, %s))", l, jsString(string(l))), &r)
	return r.Text, r.Found, err
}

// innerText waits for l's one element and returns its innerText.
func (b *tab) innerText(l locator) string {
	b.t.Helper()
	var text string
	b.waitFor("the element "+string(l), actionTimeout, pollEvery, func() (bool, any, error) {
		s, ok, err := b.tryInnerText(l)
		text = s
		return ok, "not there", err
	})
	return text
}

// waitVisible waits until l's one element is visible.
func (b *tab) waitVisible(l locator, timeout time.Duration) {
	b.t.Helper()
	b.waitFor(string(l)+" to be visible", timeout, pollEvery, func() (bool, any, error) {
		var why string
		err := b.evalJS(fmt.Sprintf("((el) => !el ? 'not there' : W.visible(el) ? '' : 'not visible')(W.one(%s, %s))", l, jsString(string(l))), &why)
		return err == nil && why == "", why, err
	})
}

// waitDetached waits until l finds nothing.
func (b *tab) waitDetached(l locator, timeout time.Duration) {
	b.t.Helper()
	b.waitFor(string(l)+" to leave the page", timeout, pollEvery, func() (bool, any, error) {
		var n int
		err := b.evalJS("("+string(l)+").length", &n)
		return n == 0, fmt.Sprintf("%d elements", n), err
	})
}

// fill types text into l's one element as a person replacing its content
// would: focus, select all, insert the text (input events fire).
func (b *tab) fill(l locator, text string) {
	b.t.Helper()
	b.waitFor("an editable "+string(l), actionTimeout, pollEvery, func() (bool, any, error) {
		var why string
		err := b.evalJS(fmt.Sprintf(`((el) => {
  if (!el) return 'not there';
  if (!W.visible(el)) return 'not visible';
  if (el.disabled || el.readOnly) return 'not editable';
  el.focus();
  el.select();
  return '';
})(W.one(%s, %s))`, l, jsString(string(l))), &why)
		return err == nil && why == "", why, err
	})
	ctx, cancel := context.WithTimeout(b.ctx, callTimeout)
	defer cancel()
	var err error
	if text == "" {
		err = chromedp.Do(ctx, b.keyAction("Delete", "Delete", 46, ""))
	} else {
		_, err = chromedp.Call(ctx, input.InsertText, input.InsertTextParams{Text: text})
	}
	if err != nil {
		b.t.Fatalf("typing into %s: %v", l, err)
	}
}

// keyAction presses and releases one key.
func (b *tab) keyAction(key, code string, vk int64, text string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		down := input.DispatchKeyEventParams{
			Type: input.DispatchKeyEventTypeKeyDown, Key: key, Code: code,
			WindowsVirtualKeyCode: vk, NativeVirtualKeyCode: vk, Text: text, UnmodifiedText: text,
		}
		if text == "" {
			down.Type = input.DispatchKeyEventTypeRawKeyDown
		}
		if _, err := cdp.Call(ctx, t, input.DispatchKeyEvent, down); err != nil {
			return err
		}
		_, err := cdp.Call(ctx, t, input.DispatchKeyEvent, input.DispatchKeyEventParams{
			Type: input.DispatchKeyEventTypeKeyUp, Key: key, Code: code,
			WindowsVirtualKeyCode: vk, NativeVirtualKeyCode: vk,
		})
		return err
	})
}

// pressEnter focuses l's one element and presses Enter on the keyboard.
func (b *tab) pressEnter(l locator) {
	b.t.Helper()
	b.waitFor(string(l)+" to take the focus", actionTimeout, pollEvery, func() (bool, any, error) {
		var ok bool
		err := b.evalJS(fmt.Sprintf("((el) => { if (!el || !W.visible(el)) return false; el.focus(); return document.activeElement === el; })(W.one(%s, %s))", l, jsString(string(l))), &ok)
		return ok, "not focusable", err
	})
	ctx, cancel := context.WithTimeout(b.ctx, callTimeout)
	defer cancel()
	if err := chromedp.Do(ctx, b.keyAction("Enter", "Enter", 13, "\r")); err != nil {
		b.t.Fatalf("pressing Enter in %s: %v", l, err)
	}
}

// click waits until l's one element can be clicked (visible, enabled, not
// covered), scrolls it into view and clicks its centre with the mouse.
func (b *tab) click(l locator) {
	b.t.Helper()
	var pt struct {
		X   float64 `json:"x"`
		Y   float64 `json:"y"`
		Why string  `json:"why"`
	}
	b.waitFor(string(l)+" to be clickable", actionTimeout, pollEvery, func() (bool, any, error) {
		pt.Why = ""
		err := b.evalJS(fmt.Sprintf("((el) => el ? W.clickPoint(el) : { why: 'not there' })(W.one(%s, %s))", l, jsString(string(l))), &pt)
		return err == nil && pt.Why == "", pt.Why, err
	})
	ctx, cancel := context.WithTimeout(b.ctx, callTimeout)
	defer cancel()
	if err := chromedp.Do(ctx,
		chromedp.MouseEvent(input.DispatchMouseEventTypeMouseMoved, pt.X, pt.Y),
		chromedp.MouseClickXY(pt.X, pt.Y),
	); err != nil {
		b.t.Fatalf("clicking %s: %v", l, err)
	}
}

// selectOption picks the option of l's one <select> whose value or label is
// v, as a person would (input and change fire), once that option exists.
func (b *tab) selectOption(l locator, v string) {
	b.t.Helper()
	b.waitFor(fmt.Sprintf("option %q in %s", v, l), actionTimeout, pollEvery, func() (bool, any, error) {
		var why string
		err := b.evalJS(fmt.Sprintf(`((el, v) => {
  if (!el) return 'not there';
  if (el.localName !== 'select') return 'not a select: ' + el.localName;
  if (!W.visible(el) || el.disabled) return 'not visible or disabled';
  const opt = [...el.options].find((o) => o.value === v || o.label === v);
  if (!opt) return 'no such option';
  el.value = opt.value;
  el.dispatchEvent(new Event('input', { bubbles: true }));
  el.dispatchEvent(new Event('change', { bubbles: true }));
  return '';
})(W.one(%s, %s), %s)`, l, jsString(string(l)), jsString(v)), &why)
		return err == nil && why == "", why, err
	})
}

// viewport sets the page's size in CSS pixels (scale 1, not a phone).
func (b *tab) viewport(width, height int64) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, callTimeout)
	defer cancel()
	if _, err := chromedp.Call(ctx, emulation.SetDeviceMetricsOverride, emulation.SetDeviceMetricsOverrideParams{
		Width: width, Height: height, DeviceScaleFactor: 1,
	}); err != nil {
		b.t.Fatalf("viewport %dx%d: %v", width, height, err)
	}
}

// colorScheme emulates prefers-color-scheme: light or dark.
func (b *tab) colorScheme(scheme string) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, callTimeout)
	defer cancel()
	if _, err := chromedp.Call(ctx, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{
		Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: scheme}},
	}); err != nil {
		b.t.Fatalf("color scheme %s: %v", scheme, err)
	}
}

// mouseMove moves the mouse to (x, y) of the viewport.
func (b *tab) mouseMove(x, y float64) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, callTimeout)
	defer cancel()
	if err := chromedp.Do(ctx, chromedp.MouseEvent(input.DispatchMouseEventTypeMouseMoved, x, y)); err != nil {
		b.t.Fatalf("moving the mouse: %v", err)
	}
}

// screenshot writes a PNG of the viewport (fullPage false), of the whole
// page (fullPage true, clip nil), or of clip, a region of the whole page.
func (b *tab) screenshot(path string, fullPage bool, clip *page.Viewport) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, callTimeout)
	defer cancel()
	p := page.CaptureScreenshotParams{Format: page.CaptureScreenshotFormatPng}
	if fullPage {
		if clip == nil {
			m, err := chromedp.Call(ctx, page.GetLayoutMetrics, cdp.Empty{})
			if err != nil {
				b.t.Fatalf("layout metrics: %v", err)
			}
			if m.CSSContentSize == nil {
				b.t.Fatal("layout metrics without the content size")
			}
			clip = &page.Viewport{Width: math.Ceil(m.CSSContentSize.Width), Height: math.Ceil(m.CSSContentSize.Height)}
		}
		clip.Scale = 1
		beyond := true
		p.Clip, p.CaptureBeyondViewport = clip, &beyond
	}
	res, err := chromedp.Call(ctx, page.CaptureScreenshot, p)
	if err != nil {
		b.t.Fatalf("screenshot %s: %v", path, err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		b.t.Fatal(err)
	}
	if err := os.WriteFile(path, res.Data, 0o644); err != nil {
		b.t.Fatal(err)
	}
}

// without returns the problems that match none of the patterns.
func without(problems []string, patterns ...*regexp.Regexp) []string {
	var out []string
next:
	for _, p := range problems {
		for _, re := range patterns {
			if re.MatchString(p) {
				continue next
			}
		}
		out = append(out, p)
	}
	return out
}
