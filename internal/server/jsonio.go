package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
)

// maxBody is the largest request body the JSON endpoints read.
const maxBody = 64 << 10

// apiError is the body of every error the API answers:
// {"error":"bad_request","detail":"…"}. Error is a stable code for
// programs, Detail a sentence for people that names the problem.
type apiError struct {
	Error  string `json:"error"`
	Detail string `json:"detail"`
}

// Error codes.
const (
	codeBadRequest    = "bad_request"
	codeNotFound      = "not_found"
	codeUnknownRule   = "unknown_rule"
	codeTooLarge      = "body_too_large"
	codeUnauthorized  = "unauthorized"
	codeAdminDisabled = "admin_disabled"
	codeMethod        = "method_not_allowed"
	codeUnsupported   = "unsupported_media_type"
	codeCrossSite     = "cross_site_request"
	codeStore         = "store_unavailable"
	codeInternal      = "internal"
)

// writeJSON answers status with v as JSON.
func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		body, _ = json.Marshal(apiError{codeInternal, "encoding the response failed: " + err.Error()})
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}

// writeError answers status with an apiError.
func writeError(w http.ResponseWriter, status int, code, format string, args ...any) {
	writeJSON(w, status, apiError{Error: code, Detail: fmt.Sprintf(format, args...)})
}

// bodyError is a request body that cannot be decoded; status is 400, 413
// or 415.
type bodyError struct {
	status int
	code   string
	detail string
}

func (e *bodyError) Error() string { return e.detail }

func (e *bodyError) write(w http.ResponseWriter) { writeError(w, e.status, e.code, "%s", e.detail) }

// readBody reads at most maxBody bytes of r's body, answering 413 beyond.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, *bodyError) {
	if r.ContentLength > maxBody {
		return nil, &bodyError{http.StatusRequestEntityTooLarge, codeTooLarge,
			fmt.Sprintf("the body is %d bytes; the limit is %d (64 KB)", r.ContentLength, maxBody)}
	}
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, &bodyError{http.StatusRequestEntityTooLarge, codeTooLarge,
				fmt.Sprintf("the body is over %d bytes (64 KB)", maxBody)}
		}
		return nil, &bodyError{http.StatusBadRequest, codeBadRequest, "reading the body failed: " + err.Error()}
	}
	return data, nil
}

// checkJSONContentType rejects a body not declared as JSON: the media
// type must be application/json or end in +json. A missing Content-Type
// and text/plain are refused too, since those are what a web page can
// send to another site without asking it first (a "simple" request, with
// no CORS preflight); requiring JSON keeps browsers of other sites out.
func checkJSONContentType(r *http.Request) *bodyError {
	ct := r.Header.Get("Content-Type")
	if ct == "" {
		return &bodyError{http.StatusUnsupportedMediaType, codeUnsupported,
			"the request has no Content-Type; send Content-Type: application/json (curl: -H 'Content-Type: application/json')"}
	}
	mt, _, _ := strings.Cut(ct, ";")
	mt = strings.ToLower(strings.TrimSpace(mt))
	if mt == "application/json" || strings.HasSuffix(mt, "+json") && strings.Count(mt, "/") == 1 && !strings.HasPrefix(mt, "/") {
		return nil
	}
	return &bodyError{http.StatusUnsupportedMediaType, codeUnsupported,
		fmt.Sprintf("Content-Type %s is not JSON; send Content-Type: application/json", quoteShort(ct))}
}

// checkCrossSite refuses a request a browser sent on behalf of a page of
// another site: Sec-Fetch-Site cross-site or same-site (a sibling
// subdomain, which may host pages weir's operator does not control), or,
// from browsers that do not send Sec-Fetch-Site, an Origin whose host is
// neither the request's Host nor its X-Forwarded-Host (which a page of
// another site cannot set without a CORS preflight that weir never
// grants). Programs send neither header; the dashboard's own requests are
// same-origin.
func checkCrossSite(r *http.Request) *bodyError {
	if sfs := strings.ToLower(strings.TrimSpace(r.Header.Get("Sec-Fetch-Site"))); sfs != "" {
		if sfs == "same-origin" || sfs == "none" {
			return nil
		}
		return &bodyError{http.StatusForbidden, codeCrossSite,
			fmt.Sprintf("a browser sent this request for a page of another site (Sec-Fetch-Site: %s); /v1/check takes requests from programs and from weir's own dashboard only", quoteShort(sfs))}
	}
	origin := r.Header.Get("Origin")
	if origin == "" {
		return nil
	}
	if u, err := url.Parse(origin); err == nil && u.Host != "" && (strings.EqualFold(u.Host, r.Host) ||
		strings.EqualFold(u.Host, strings.TrimSpace(r.Header.Get("X-Forwarded-Host")))) {
		return nil
	}
	return &bodyError{http.StatusForbidden, codeCrossSite,
		fmt.Sprintf("a browser sent this request for a page of another origin (Origin %s, Host %s); /v1/check takes requests from programs and from weir's own dashboard only", quoteShort(origin), quoteShort(r.Host))}
}

// decodeStrict decodes data into v, rejecting unknown fields, trailing
// data and type mismatches with a message that names the field.
func decodeStrict(data []byte, v any) *bodyError {
	if len(bytes.TrimSpace(data)) == 0 {
		return &bodyError{http.StatusBadRequest, codeBadRequest, "the body is empty; send a JSON object"}
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return &bodyError{http.StatusBadRequest, codeBadRequest, describeJSONError(data, err)}
	}
	if dec.More() {
		return &bodyError{http.StatusBadRequest, codeBadRequest, "the body holds data after the JSON object; send exactly one object"}
	}
	var extra json.RawMessage
	if err := dec.Decode(&extra); err != io.EOF {
		return &bodyError{http.StatusBadRequest, codeBadRequest, "the body holds data after the JSON object; send exactly one object"}
	}
	return nil
}

// describeJSONError turns a decoding error into a sentence naming the
// problem and where it is.
func describeJSONError(data []byte, err error) string {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		line, col := position(data, syn.Offset)
		return fmt.Sprintf("malformed JSON at line %d, column %d: %v", line, col, syn)
	case errors.As(err, &typ):
		field := typ.Field
		if field == "" {
			return fmt.Sprintf("the body is a JSON %s; want an object", typ.Value)
		}
		return fmt.Sprintf("field %q is a JSON %s; want %s", field, typ.Value, jsonTypeName(typ.Type.String()))
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "malformed JSON: the body ends before the object does"
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		name := strings.TrimPrefix(err.Error(), "json: unknown field ")
		return "unknown field " + name + " in the body"
	}
	return "malformed JSON: " + err.Error()
}

func jsonTypeName(goType string) string {
	switch goType {
	case "int64", "int", "*int64", "uint32", "int32":
		return "a whole number"
	case "string":
		return "a string"
	case "bool":
		return "true or false"
	}
	if strings.HasPrefix(goType, "[]") {
		return "an array"
	}
	return "a " + goType
}

// position converts a byte offset into a 1-based line and column.
func position(data []byte, off int64) (line, col int) {
	off = min(max(off, 0), int64(len(data)))
	line, col = 1, 1
	for _, c := range data[:off] {
		if c == '\n' {
			line++
			col = 1
		} else {
			col++
		}
	}
	return line, col
}

// topKeys reports whether body is a JSON object with the top-level key
// "domain" or "descriptors" (envoy), and with "rule", as decoding it into
// a map[string]json.RawMessage would find them (keys compared after
// unescaping, exactly), without decoding it: false, false for anything
// but a valid JSON object.
func topKeys(body []byte) (envoy, rule bool) {
	if !json.Valid(body) {
		return false, false
	}
	i := skipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return false, false
	}
	i++
	for {
		i = skipSpace(body, i)
		if body[i] == '}' {
			return envoy, rule
		}
		end := skipString(body, i)
		key := body[i+1 : end-1]
		if bytes.IndexByte(key, '\\') >= 0 {
			var k string
			_ = json.Unmarshal(body[i:end], &k) // valid: body is
			key = []byte(k)
		}
		switch string(key) {
		case "domain", "descriptors":
			envoy = true
		case "rule":
			rule = true
		}
		i = skipSpace(body, end) + 1 // past the ':'
		i = skipValue(body, skipSpace(body, i))
		i = skipSpace(body, i)
		if body[i] == ',' {
			i++
		}
	}
}

// skipSpace returns the index of the first byte at or after i of a valid
// JSON text that is not white space.
func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index just past the JSON string starting at b[i].
func skipString(b []byte, i int) int {
	for i++; b[i] != '"'; i++ {
		if b[i] == '\\' {
			i++
		}
	}
	return i + 1
}

// skipValue returns the index just past the JSON value starting at b[i],
// in a valid JSON text.
func skipValue(b []byte, i int) int {
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for ; ; i++ {
			switch b[i] {
			case '"':
				i = skipString(b, i) - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
		}
	}
	for i < len(b) && b[i] != ',' && b[i] != '}' && b[i] != ']' && b[i] != ' ' && b[i] != '\t' && b[i] != '\n' && b[i] != '\r' {
		i++
	}
	return i
}
