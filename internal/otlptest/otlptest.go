// Package otlptest runs an OTLP trace receiver inside a test, over HTTP
// (protobuf) or gRPC, and keeps the spans it is sent.
package otlptest

import (
	"context"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// Span is a received span, flattened for assertions.
type Span struct {
	Name                    string
	TraceID, SpanID, Parent string // hex; Parent is "" for a root
	Kind                    tracepb.Span_SpanKind
	Attrs                   map[string]any
	Service                 string // the resource's service.name
	StatusError             bool
}

// Receiver collects spans.
type Receiver struct {
	// Endpoint is what OTEL_EXPORTER_OTLP_ENDPOINT should say.
	Endpoint string

	mu    sync.Mutex
	spans []Span
}

// NewHTTP starts an OTLP/HTTP receiver (POST /v1/traces, protobuf).
func NewHTTP(t testing.TB) *Receiver {
	rc := &Receiver{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/traces" || r.Method != http.MethodPost {
			http.NotFound(w, r)
			return
		}
		body, err := io.ReadAll(r.Body)
		var req coltracepb.ExportTraceServiceRequest
		if err == nil {
			err = proto.Unmarshal(body, &req)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		rc.add(&req)
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Write(out)
	}))
	t.Cleanup(srv.Close)
	rc.Endpoint = srv.URL
	return rc
}

type grpcService struct {
	coltracepb.UnimplementedTraceServiceServer
	rc *Receiver
}

func (g grpcService) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	g.rc.add(req)
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// NewGRPC starts an OTLP/gRPC receiver; Endpoint is http://host:port.
func NewGRPC(t testing.TB) *Receiver {
	rc := &Receiver{}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(gs, grpcService{rc: rc})
	go gs.Serve(l)
	t.Cleanup(gs.Stop)
	rc.Endpoint = "http://" + l.Addr().String()
	return rc
}

func (rc *Receiver) add(req *coltracepb.ExportTraceServiceRequest) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for _, rs := range req.ResourceSpans {
		service := ""
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.Key == "service.name" {
				service = kv.Value.GetStringValue()
			}
		}
		for _, ss := range rs.ScopeSpans {
			for _, sp := range ss.Spans {
				s := Span{
					Name: sp.Name, TraceID: hex.EncodeToString(sp.TraceId), SpanID: hex.EncodeToString(sp.SpanId),
					Parent: hex.EncodeToString(sp.ParentSpanId), Kind: sp.Kind, Attrs: map[string]any{}, Service: service,
					StatusError: sp.GetStatus().GetCode() == tracepb.Status_STATUS_CODE_ERROR,
				}
				for _, kv := range sp.Attributes {
					s.Attrs[kv.Key] = value(kv.Value)
				}
				rc.spans = append(rc.spans, s)
			}
		}
	}
}

func value(v *commonpb.AnyValue) any {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_BoolValue:
		return x.BoolValue
	case *commonpb.AnyValue_IntValue:
		return x.IntValue
	case *commonpb.AnyValue_DoubleValue:
		return x.DoubleValue
	}
	return v.String()
}

// Spans returns the spans received so far.
func (rc *Receiver) Spans() []Span {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]Span(nil), rc.spans...)
}

// WaitFor polls until cond holds for the spans received, or fails t after
// a generous deadline.
func (rc *Receiver) WaitFor(t testing.TB, what string, cond func([]Span) bool) []Span {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		spans := rc.Spans()
		if cond(spans) {
			return spans
		}
		if time.Now().After(deadline) {
			t.Fatalf("otlptest: no %s after 30s; got %d spans: %+v", what, len(spans), spans)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
